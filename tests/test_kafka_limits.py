"""The Kafka record limit: which limit applies, and a record's size as the broker counts it.

Pure logic, no broker (integration/test_kafka_refusals.py checks the sizes against a real
broker's ``max.message.bytes`` to the byte).
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txsink.connectors.kafka.records.format import RECORD_SCHEMA
from txsink.connectors.kafka.records.limits import (
    BATCH_OVERHEAD,
    RecordLimit,
    batch_cap,
    batch_size,
    batch_sizes,
    compression_margin,
    effective_limit,
    largest_batch_size,
    varint_size,
)


@pytest.mark.parametrize(
    ("value", "size"),
    [(0, 1), (-1, 1), (63, 1), (64, 2), (-64, 1), (-65, 2), (8191, 2), (8192, 3), (2**27, 5)],
)
def test_varint_size_is_kafkas_zigzag_varint(value: int, size: int) -> None:
    assert varint_size(value) == size


def test_batch_of_one_record_counts_the_v2_record_and_the_batch_header() -> None:
    # A null key and a 10-byte value: attributes, timestamp delta, offset delta (3), key
    # length -1 (1), value length (1) + 10, no headers (1) = 16; its length varint (1).
    assert batch_size(None, 10) == BATCH_OVERHEAD + 17
    # A 3-byte key and a 200,000-byte value: lengths of 1 and 3 varint bytes.
    body = 3 + (1 + 3) + (3 + 200_000) + 1
    assert batch_size(3, 200_000) == BATCH_OVERHEAD + varint_size(body) + body
    # One header "h" -> 2 bytes, and one with a null value.
    with_headers = batch_size(None, 0, [(1, 2), (1, None)])
    assert with_headers == BATCH_OVERHEAD + 1 + (3 + 1 + 1 + 1 + (1 + 1 + 1 + 2) + (1 + 1 + 1))


def test_compression_adds_a_margin_that_grows_with_the_record() -> None:
    assert compression_margin(10_000, False) == 0
    assert compression_margin(10_000, True) == 64 + 10
    assert batch_size(None, 10_000, compressed=True) > batch_size(None, 10_000)


def test_vectorised_sizes_equal_the_scalar_ones() -> None:
    rng = random.Random(7)
    rows = []
    for _ in range(300):
        key = None if rng.random() < 0.3 else bytes(rng.randrange(0, 300))
        value = None if rng.random() < 0.1 else bytes(rng.choice([0, 5, 127, 128, 20_000]))
        headers = (
            None
            if rng.random() < 0.5
            else [{"key": "h" * rng.randrange(0, 70), "value": bytes(rng.randrange(0, 200))}]
        )
        rows.append((key, value, headers))
    for compressed in (False, True):
        batch = pa.RecordBatch.from_pylist(
            [{"topic": "t", "key": k, "value": v, "headers": h} for k, v, h in rows],
            schema=RECORD_SCHEMA,
        )
        got = batch_sizes(
            batch.column(2), batch.column(3), batch.column(4), compressed=compressed
        ).to_pylist()
        want = [
            batch_size(
                None if k is None else len(k),
                None if v is None else len(v),
                [(len(x["key"]), len(x["value"])) for x in h or ()],
                compressed=compressed,
            )
            for k, v, h in rows
        ]
        assert got == want


_LENGTHS = st.one_of(st.none(), st.integers(0, 130), st.sampled_from([16_383, 16_384, 20_000]))


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(st.tuples(_LENGTHS, _LENGTHS), min_size=1, max_size=40),
    skip=st.integers(0, 3),
    compressed=st.booleans(),
)
def test_the_bound_of_a_batch_is_at_least_each_records_size_and_reached(
    rows: list[tuple[int | None, int | None]], skip: int, compressed: bool
) -> None:
    """The size check skips per-record sizes when this bound fits: it must be at least every
    record's size (or a record over the limit would pass), for any lengths and nulls, in a
    slice of a batch too; and it is the size of a batch of the longest key and value."""
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "topic": "t",
                "key": None if k is None else bytes(k),
                "value": None if v is None else b"v" * v,
            }
            for k, v in [(None, 99_999)] * skip + rows
        ],
        schema=RECORD_SCHEMA,
    ).slice(skip)
    key, value, headers = batch.column(2), batch.column(3), batch.column(4)
    bound = largest_batch_size(key, value, headers, compressed=compressed)
    sizes = batch_sizes(key, value, headers, compressed=compressed).to_pylist()
    assert bound is not None and bound >= max(sizes)
    longest = [max((n or 0) for n in col) for col in zip(*rows, strict=True)]
    assert bound == batch_size(longest[0], longest[1], compressed=compressed)


def test_a_batch_with_headers_has_no_bound() -> None:
    batch = pa.RecordBatch.from_pylist(
        [{"topic": "t", "key": b"k", "value": b"v", "headers": [{"key": "h", "value": b"x"}]}],
        schema=RECORD_SCHEMA,
    )
    assert largest_batch_size(*batch.columns[2:], compressed=False) is None


def test_the_smallest_limit_applies_and_says_where_it_comes_from() -> None:
    topic = effective_limit("t", topic_max=20_000, topic_max_source="set on the topic")
    assert topic == RecordLimit(20_000, "topic 't' max.message.bytes=20000 (set on the topic)")
    producer = effective_limit("t", topic_max=2_000_000, producer_max=1_000_000)
    assert producer == RecordLimit(1_000_000, "the producer's message.max.bytes=1000000")
    unknown = effective_limit("t", topic_max=None, producer_max=500_000)
    assert unknown.nbytes == 500_000
    assert effective_limit("t", topic_max=20_000, explicit=5_000) == RecordLimit(
        5_000, "max_record_bytes=5000"
    )


def test_an_explicit_limit_above_the_topics_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"max_record_bytes=1000000 is larger than topic 't'"):
        effective_limit("t", topic_max=20_000, explicit=1_000_000)
    with pytest.raises(ValueError, match="Lower max_record_bytes to at most 20000"):
        effective_limit("t", topic_max=20_000, explicit=20_001)


def test_batch_cap_leaves_room_for_the_header_and_the_codec() -> None:
    assert batch_cap(20_000, False) == 20_000 - BATCH_OVERHEAD
    assert batch_cap(20_000, True) == 20_000 - BATCH_OVERHEAD - compression_margin(20_000, True)
    assert batch_cap(10, True) == 1


def test_s3_objects_larger_than_s3_takes_are_refused_at_construction() -> None:
    """S3's own object limit (5 TiB), which CompleteMultipartUpload enforces after the
    decision: an S3Sink whose objects could reach it is refused when it is built."""
    from txsink.connectors.s3 import S3Sink

    with pytest.raises(ValueError, match="largest object"):
        S3Sink("s3://b/p", uid="s", part_bytes=5 * 1024**3, target_object_bytes=4 * 1024**4)
