"""The replay checksum (txsink/connectors/kafka/records/checksum.py): every version keeps its
values (pinned), version 3 equals its pure-Python reference, covers every field, tells
nulls from empty values and ignores order and batching."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.kafka import RECORD_SCHEMA, KafkaReplayHandle
from txsink.connectors.kafka.clients.columns import py_columns
from txsink.connectors.kafka.records.checksum import CHECKSUM_VERSION, SIPHASH_KEY, checksum
from txsink.handles import dump_handle, load_handle
from txsink.txid import TxnId

M64 = (1 << 64) - 1


def rows() -> list[dict[str, Any]]:
    return [
        {"topic": "orders", "partition": None, "key": b"k1", "value": b'{"a":1}', "headers": None},
        {"topic": "orders", "partition": 3, "key": None, "value": b"", "headers": []},
        {
            "topic": "t\u00e9",
            "partition": -1,
            "key": b"",
            "value": None,
            "headers": [{"key": "h", "value": b"x"}, {"key": "h2", "value": None}],
        },
        {
            "topic": "orders",
            "partition": 0,
            "key": b"\x00\xff",
            "value": b"v" * 300,
            "headers": [{"key": "", "value": b""}],
        },
    ]


def batch(items: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(items, schema=RECORD_SCHEMA)


# Computed with txsink's checksum before version 3 (commit c8054dc): versions 1 and 2 must
# verify the epochs they decided exactly as they did.
PINNED = {
    1: (
        14055769850916749825,
        [3731413492215094362, 10206644371623120782, 10126714981474684591, 8437741079313401706],
    ),
    2: (
        3923800241314841269,
        [8142482437455077326, 671041575390096641, 9200767844396070554, 4356252457783148364],
    ),
}
# Version 3's values, pinned when it was introduced (they must never change either).
PINNED_V3 = (
    17631993276506793109,
    [4592297950306657803, 2455124333541908184, 8313723681977402004, 2270847310680825118],
)


@pytest.mark.parametrize("version", [1, 2])
def test_old_versions_keep_their_values(version: int) -> None:
    total, each = PINNED[version]
    assert checksum(batch(rows()), version) == total
    assert [checksum(batch([r]), version) for r in rows()] == each


def test_version_3_values_are_pinned() -> None:
    total, each = PINNED_V3
    assert [checksum(batch([r]), 3) for r in rows()] == each
    assert checksum(batch(rows()), 3) == total == sum(each) % (1 << 64)


def test_version_3_is_its_reference() -> None:
    rng = random.Random(7)
    items = rows() + [random_row(rng) for _ in range(300)]
    assert checksum(batch(items), 3) == reference_v3(items)


def test_order_and_batching_do_not_matter() -> None:
    rng = random.Random(3)
    items = rows() + [random_row(rng) for _ in range(200)]
    whole = batch(items)
    shuffled = items[:]
    rng.shuffle(shuffled)
    parts = [batch(shuffled[i : i + 17]) for i in range(0, len(shuffled), 17)]
    for version in (1, 2, 3):
        assert sum(checksum(p, version) for p in parts) % (1 << 64) == checksum(whole, version)
    # Slices of one batch (Arrow offsets not at 0, sliced headers) as well.
    sliced = [whole.slice(i, 23) for i in range(0, len(items), 23)]
    assert sum(checksum(s, 3) for s in sliced) % (1 << 64) == checksum(whole, 3)


def test_every_field_counts_and_nulls_differ_from_empty() -> None:
    base = {
        "topic": "t",
        "partition": 1,
        "key": b"k",
        "value": b"v",
        "headers": [{"key": "a", "value": b"1"}, {"key": "b", "value": b"2"}],
    }
    variants: list[dict[str, Any]] = [
        {"topic": "u"},
        {"partition": 2},
        {"partition": None},
        {"partition": 0},
        {"key": b"K"},
        {"key": None},
        {"key": b""},
        {"value": b"V"},
        {"value": None},
        {"value": b""},
        {"headers": None},
        {"headers": []},
        {"headers": [{"key": "b", "value": b"2"}, {"key": "a", "value": b"1"}]},  # order
        {"headers": [{"key": "a", "value": b"1"}]},
        {"headers": [{"key": "a", "value": b"2"}, {"key": "b", "value": b"2"}]},
        {"headers": [{"key": "A", "value": b"1"}, {"key": "b", "value": b"2"}]},
        {"headers": [{"key": "a", "value": None}, {"key": "b", "value": b"2"}]},
        {"headers": [{"key": "a", "value": b""}, {"key": "b", "value": b"2"}]},
        {"key": b"v", "value": b"k"},  # swapped fields
    ]
    sums = [checksum(batch([{**base, **v}]), 3) for v in [{}, *variants]]
    assert len(set(sums)) == len(sums)
    # null and empty headers differ, and an empty key from no key, in version 2 too
    assert checksum(batch([{**base, "key": None}]), 2) != checksum(batch([{**base, "key": b""}]), 2)


def test_given_columns_and_one_topic_give_the_same() -> None:
    rng = random.Random(5)
    items = [random_row(rng) for _ in range(50)]
    for item in items:
        item["topic"] = "same"
    b = batch(items)
    assert py_columns(b).topic == "same"
    assert checksum(b, 3, py_columns(b)) == checksum(b, 3) == reference_v3(items)
    mixed = batch([*items, {**items[0], "topic": "other"}])
    assert py_columns(mixed).topic is None
    assert checksum(mixed, 3) == reference_v3([*items, {**items[0], "topic": "other"}])


def test_unknown_version_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown replay checksum version 4"):
        checksum(batch(rows()), 4)


def test_handles_keep_their_checksum_version() -> None:
    txn = TxnId.parse("txsink.a.u.e1.r0.p0.a0")
    new = KafkaReplayHandle(txn=txn, rows=1, shards=2, checksum=7)
    assert new.checksum_version == CHECKSUM_VERSION == 3 and KafkaReplayHandle.version == 3
    assert load_handle(dump_handle(new)) == new
    v2 = {"txn": str(txn), "rows": 1, "shards": 2, "checksum": 7, "checksum_version": 2}
    old = load_handle({"serializer": "kafka.replay", "version": 2, "data": v2})
    assert isinstance(old, KafkaReplayHandle) and old.checksum_version == 2
    v1 = load_handle({"serializer": "kafka.replay", "version": 1, "data": {**v2}})
    assert isinstance(v1, KafkaReplayHandle) and v1.checksum_version == 1


# -- the reference ---------------------------------------------------------------------------


def random_row(rng: random.Random) -> dict[str, Any]:
    def blob() -> bytes | None:
        return None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 1, 7, 8, 9, 200]))

    headers = None
    if rng.random() < 0.5:
        headers = [
            {"key": rng.choice(["a", "b", "\u00fc"]), "value": blob()}
            for _ in range(rng.randint(0, 3))
        ]
    return {
        "topic": rng.choice(["t1", "t2", "\u00e9t\u00e9"]),
        "partition": rng.choice([None, 0, 1, -1, 2**31 - 1]),
        "key": blob(),
        "value": blob(),
        "headers": headers,
    }


def reference_v3(items: list[dict[str, Any]]) -> int:
    """Checksum version 3, one record at a time, in plain Python: the specification."""
    null, m = 0x6E756C6C_7478736B, 0x9E3779B97F4A7C15

    def h(x: str | bytes | None) -> int:
        if x is None:
            return null
        data = x.encode() if isinstance(x, str) else x
        return mix(siphash24(SIPHASH_KEY.encode(), data))

    def combine(acc: int, field: int) -> int:
        return mix(((acc * m) & M64) ^ field)

    total = 0
    for r in items:
        part = 0 if r["partition"] is None else mix((r["partition"] & 0xFFFFFFFF) | 1 << 32)
        if r["headers"] is None:
            headers = null
        else:
            each = [combine(h(x["key"]), h(x["value"])) for x in r["headers"]]
            salted = sum(mix((e + i * m) & M64) for i, e in enumerate(each)) & M64
            headers = combine(len(each), salted)
        acc = h(r["topic"])
        for field in (part, h(r["key"]), h(r["value"]), headers):
            acc = combine(acc, field)
        total += acc
    return total & M64


def mix(x: int) -> int:
    """The splitmix64 finaliser."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 (Aumasson and Bernstein), 64-bit output."""

    def rotl(x: int, b: int) -> int:
        return ((x << b) | (x >> (64 - b))) & M64

    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261]
    v.append(k1 ^ 0x7465646279746573)

    def rounds(n: int) -> None:
        for _ in range(n):
            v[0] = (v[0] + v[1]) & M64
            v[1] = rotl(v[1], 13) ^ v[0]
            v[0] = rotl(v[0], 32)
            v[2] = (v[2] + v[3]) & M64
            v[3] = rotl(v[3], 16) ^ v[2]
            v[0] = (v[0] + v[3]) & M64
            v[3] = rotl(v[3], 21) ^ v[0]
            v[2] = (v[2] + v[1]) & M64
            v[1] = rotl(v[1], 17) ^ v[2]
            v[2] = rotl(v[2], 32)

    tail = len(data) % 8
    for i in range(0, len(data) - tail, 8):
        word = int.from_bytes(data[i : i + 8], "little")
        v[3] ^= word
        rounds(2)
        v[0] ^= word
    last = (len(data) & 0xFF) << 56 | int.from_bytes(data[len(data) - tail :], "little")
    v[3] ^= last
    rounds(2)
    v[0] ^= last
    v[2] ^= 0xFF
    rounds(4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def test_siphash_reference_vector() -> None:
    # The SipHash paper's test vector: key 00..0f, message 00..0e.
    key = bytes(range(16))
    assert siphash24(key, bytes(range(15))) == 0xA129CA6149BE45E5
