"""How large a record the brokers take, and each record's size as the broker counts it.

A broker refuses a produce whose **record batch** is larger than the topic's
``max.message.bytes`` (``RecordTooLargeException``, ``MSG_SIZE_TOO_LARGE``); a
librdkafka producer refuses locally a message over its own ``message.max.bytes``. Both
would refuse after the decision (WAL and replay mode produce at the commit), so the
pre-commit checks every record against the smallest limit that applies
(:func:`effective_limit`), measured the way the broker measures it (:func:`batch_size`):

- the record in Kafka's record format v2 (``DefaultRecord``): a varint length, then
  attributes (1 byte), timestamp delta and offset delta (1 byte each in a batch of one
  record), key length (varint, -1 for null) and key, value length and value, the header
  count (varint) and each header's key and value with their varint lengths;
- plus the batch's own header, :data:`BATCH_OVERHEAD` = 61 bytes (``DefaultRecordBatch.
  RECORD_BATCH_OVERHEAD``: base offset 8 and length 4, then 49 bytes of epoch, magic, CRC,
  attributes, offsets, timestamps, producer id/epoch, sequence and record count): the
  broker compares ``batch.sizeInBytes``, which includes them;
- plus, when the producer compresses, :func:`compression_margin`: a record that does not
  compress can come out slightly larger than it went in (the codec's frame and block
  headers), and the broker counts the compressed batch.

A producer batches: the broker checks the batch, not the record, so a record that fits
alone must also not be put in a batch with others beyond the limit. A record larger
than ``batch.size`` is sent in a batch of its own (librdkafka: "this limit is applied
after the first message has been added to the batch"), and the sink caps the producers'
``batch.size`` at :func:`batch_cap` of the smallest limit it writes to, so that every
batch of several records fits too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "BATCH_OVERHEAD",
    "DEFAULT_PRODUCER_MAX",
    "RecordLimit",
    "batch_cap",
    "batch_size",
    "batch_sizes",
    "compression_margin",
    "effective_limit",
    "largest_batch_size",
    "varint_size",
]

#: ``DefaultRecordBatch.RECORD_BATCH_OVERHEAD``: a v2 batch's bytes before its records.
BATCH_OVERHEAD = 61
#: librdkafka's default ``message.max.bytes`` (the largest request it builds).
DEFAULT_PRODUCER_MAX = 1_000_000
#: The compression margin's fixed part: the largest frame header and footer of the codecs
#: librdkafka offers (LZ4 frame: 19 + 8; zstd: 18 + 4; gzip: 18; snappy's xerial frame: 16),
#: with room to spare.
_COMPRESSION_FIXED = 64
#: ... and its proportional part: one in 1024 bytes covers the per-block headers of data
#: that does not compress (LZ4: 4 per 64 KiB block; zstd: 3 per 128 KiB; gzip: 5 per
#: stored block of at least 16 KiB; snappy: 8 per 32 KiB frame chunk plus tags of at most
#: 5 bytes per 64 KiB literal: about one in 3,300).
_COMPRESSION_PER = 1024


def varint_size(value: int) -> int:
    """The bytes of ``value`` as a zig-zag varint (Kafka's ``ByteUtils.sizeOfVarint``)."""
    zigzag = (value << 1) ^ (value >> 63)
    size = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def compression_margin(nbytes: int, compressed: bool) -> int:
    """How much larger than ``nbytes`` a batch can come out of the producer's codec (0 when
    it does not compress): see the module docs for the bound."""
    return _COMPRESSION_FIXED + -(-nbytes // _COMPRESSION_PER) if compressed else 0


def batch_size(
    key: int | None,
    value: int | None,
    headers: Sequence[tuple[int, int | None]] = (),
    *,
    compressed: bool = False,
) -> int:
    """The size the broker checks for a batch holding this one record: ``key`` and
    ``value`` lengths (None: null), ``headers`` as (key length, value length) pairs."""
    body = 3  # attributes, timestamp delta 0, offset delta 0
    for length in (key, value):
        body += varint_size(-1 if length is None else length) + (length or 0)
    body += varint_size(len(headers))
    for hkey, hvalue in headers:
        body += varint_size(hkey) + hkey + varint_size(-1 if hvalue is None else hvalue)
        body += hvalue or 0
    records = varint_size(body) + body
    return BATCH_OVERHEAD + records + compression_margin(records, compressed)


def _varint_sizes(lengths: pa.Array) -> pa.Array:
    """Vectorised :func:`varint_size` of non-negative lengths (or -1 for null: 1 byte)."""
    zigzag = pc.multiply(pc.max_element_wise(lengths, 0), 2)
    size = pa.scalar(1, pa.int64())
    for bits in (7, 14, 21, 28, 35):
        size = pc.add(size, pc.cast(pc.greater_equal(zigzag, 1 << bits), pa.int64()))
    return size


def _field_sizes(arr: pa.Array) -> pa.Array:
    """Bytes of a nullable binary field in a v2 record: its varint length and its bytes."""
    length = pc.fill_null(pc.cast(pc.binary_length(arr), pa.int64()), -1)
    return pc.add(_varint_sizes(length), pc.max_element_wise(length, 0))


def batch_sizes(key: pa.Array, value: pa.Array, headers: pa.Array, *, compressed: bool) -> pa.Array:
    """:func:`batch_size` of every record (``key``, ``value`` binary; ``headers`` a list of
    ``{key: string, value: binary}`` per record, or null), as an int64 array."""
    body = pc.add(pc.add(_field_sizes(key), _field_sizes(value)), 3)
    if headers.null_count < len(headers):
        extra = [
            1 if hs is None else _headers_size(hs) for hs in headers.to_pylist()
        ]  # headers are rare: a Python loop here costs nothing in the usual case
        # (a record without headers has a header count of 0: one byte)
        body = pc.add(body, pa.array(extra, pa.int64()))
    else:
        body = pc.add(body, 1)  # a header count of 0
    records = pc.add(_varint_sizes(body), body)
    total = pc.add(records, BATCH_OVERHEAD)
    if compressed:
        margin = pc.add(pc.divide(pc.add(records, _COMPRESSION_PER - 1), _COMPRESSION_PER), 64)
        total = pc.add(total, margin)
    return pc.cast(total, pa.int64())


def largest_batch_size(
    key: pa.Array, value: pa.Array, headers: pa.Array, *, compressed: bool
) -> int | None:
    """An upper bound of :func:`batch_sizes` over a batch without headers (None when some
    record has headers): :func:`batch_size` of its longest key and longest value. Cheap
    (the offsets buffers' largest step), so the usual batch, far below its limit, is
    checked without a size per record; only a batch whose bound is over the limit needs
    them, to find and name the record."""
    if headers.null_count < len(headers):
        return None
    return batch_size(_longest(key), _longest(value), compressed=compressed)


def _longest(arr: pa.Array) -> int:
    """The largest byte length of a binary array's slots (a null slot's bytes included: an
    upper bound)."""
    if len(arr) == 0 or arr.null_count == len(arr):
        return 0
    if not (pa.types.is_binary(arr.type) or pa.types.is_string(arr.type)):
        return int(pc.max(pc.binary_length(arr)).as_py() or 0)
    offsets = np.frombuffer(
        arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4
    )
    return int(np.max(np.diff(offsets)))


def _headers_size(headers: list[dict[str, object]]) -> int:
    size = varint_size(len(headers))
    for h in headers:
        hkey = len(str(h["key"]).encode())
        raw = h["value"]
        hvalue = None if raw is None else len(raw)  # type: ignore[arg-type]
        size += varint_size(hkey) + hkey + varint_size(-1 if hvalue is None else hvalue)
        size += hvalue or 0
    return size


@dataclass(frozen=True)
class RecordLimit:
    """The largest batch of one record a topic takes from this sink, and where it comes from
    (for the error that names the setting to change)."""

    nbytes: int
    source: str


def effective_limit(
    topic: str,
    *,
    topic_max: int | None,
    topic_max_source: str = "",
    producer_max: int = DEFAULT_PRODUCER_MAX,
    explicit: int | None = None,
) -> RecordLimit:
    """The smallest limit that applies to a record for ``topic``.

    ``topic_max``: the topic's effective ``max.message.bytes`` (describe_configs on the
    topic: the topic's own setting, or the broker's ``message.max.bytes`` it defaults to,
    as ``topic_max_source`` says); ``producer_max``: the producer's ``message.max.bytes``;
    ``explicit``: the sink's ``max_record_bytes``. Raises ``ValueError`` (with the fix)
    when ``explicit`` is larger than the topic or the producer allows: every record between
    the two would pass the pre-commit and be refused after the decision.
    """
    found = [(producer_max, f"the producer's message.max.bytes={producer_max}")]
    if topic_max is not None:
        where = f" ({topic_max_source})" if topic_max_source else ""
        found.append((topic_max, f"topic {topic!r} max.message.bytes={topic_max}{where}"))
    allowed, source = min(found)
    if explicit is not None:
        if explicit > allowed:
            raise ValueError(
                f"max_record_bytes={explicit} is larger than {source} allows: records between "
                "the two would pass the pre-commit and be refused by Kafka after the decision. "
                f"Lower max_record_bytes to at most {allowed} (or leave it unset: the sink "
                "derives it), or raise the limit it names"
            )
        return RecordLimit(explicit, f"max_record_bytes={explicit}")
    return RecordLimit(allowed, source)


def batch_cap(limit: int, compressed: bool) -> int:
    """The producer ``batch.size`` under which every batch (of any number of records) fits
    ``limit``: librdkafka counts ``batch.size`` before compression, so the codec's margin
    comes off, and the batch header too (whether ``batch.size`` counts it or not)."""
    return max(1, limit - BATCH_OVERHEAD - compression_margin(limit, compressed))
