"""The replay checksum: an order-independent sum of per-record hashes of Kafka records.

Replay and direct mode count and checksum each shard's records at pre-commit
(:class:`Tally`), and a commit from the epoch's replay refuses a replay whose count or
checksum differ (:mod:`~txsink.connectors.kafka.fromreplay`). Spark does not keep row order (nor the
batching) in a replay, so the checksum is a sum, mod 2**64, of one hash per record.

A handle keeps the version its checksum was made with, and the commit verifies with that
version, so every version stays here unchanged:

* 1 (txsink <= 0.1): CRC32 of topic, key, value; nulls read as empty.
* 2: CRC32 over every field that reaches Kafka (topic, partition, key, value, headers),
  null key or value told from an empty one. A Python loop over the records.
* 3 (new pre-commits): vectorised, about 5x faster. Each variable-length field (topic,
  key, value, header keys and values) is hashed by ``pandas.util.hash_array`` with a fixed
  key: SipHash-2-4 of its UTF-8 bytes, then the splitmix64 finaliser; pandas is a
  dependency of txsink already. A null gets the constant ``_NULL`` instead; the
  partition is its 32 bits plus a "present" bit; a record's headers are the sum of
  their hashes salted by their position, combined with their count. The fields are
  folded in order with ``_combine``; everything is uint64 arithmetic in numpy.
  tests/test_kafka_checksum.py holds a pure-Python reference of version 3 and pinned
  values of every version.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txsink.audit.digest import NULL as _NULL
from txsink.audit.digest import SIPHASH_KEY
from txsink.audit.digest import M as _M
from txsink.audit.digest import combine as _combine
from txsink.audit.digest import mix as _mix
from txsink.audit.digest import siphash as _siphash
from txsink.connectors.kafka.clients.columns import PyColumns, py_columns

if TYPE_CHECKING:
    import numpy.typing as npt

    U64 = npt.NDArray[np.uint64]

__all__ = ["CHECKSUM_VERSION", "SIPHASH_KEY", "VERSIONS", "Tally", "checksum"]

#: The checksum new pre-commits record.
CHECKSUM_VERSION = 3
#: Every version a decided handle may name.
VERSIONS = (1, 2, 3)
_MOD = 1 << 64

#: Version 3's SipHash key, hash of a null field and multiplier: the row digest's
#: (:mod:`txsink.audit.digest`), which was built on this checksum.
_PRESENT = np.uint64(1 << 32)


def checksum(records: pa.RecordBatch, version: int, columns: PyColumns | None = None) -> int:
    """Order-independent checksum of ``records``
    (:data:`~txsink.connectors.kafka.records.format.RECORD_SCHEMA`) with checksum ``version``;
    ``columns``: the batch's :func:`~txsink.connectors.kafka.clients.columns.py_columns`, if the
    caller converted it already (version 3 hashes those objects)."""
    if version == 3:
        return _v3(records, columns or py_columns(records))
    if version in (1, 2):
        return _crc(records, version)
    raise ValueError(f"unknown replay checksum version {version} (known: {VERSIONS})")


@dataclass
class Tally:
    """A count and an order-independent checksum of records, as they pass."""

    version: int = CHECKSUM_VERSION
    rows: int = 0
    nbytes: int = 0
    checksum: int = 0

    def reset(self) -> None:
        self.rows = self.nbytes = self.checksum = 0

    def add(self, records: pa.RecordBatch, columns: PyColumns | None = None) -> None:
        """Count ``records`` in (``columns``: as Python objects, if converted already)."""
        self.checksum = (self.checksum + checksum(records, self.version, columns)) % _MOD
        self.rows += records.num_rows
        self.nbytes += records.nbytes


# -- version 3 -------------------------------------------------------------------------------


def _v3(records: pa.RecordBatch, cols: PyColumns) -> int:
    n = records.num_rows
    if n == 0:
        return 0
    topic, partition, key, value, headers = records.columns
    if cols.topic is not None:  # one topic (the usual case): hash it once
        one = _siphash(np.array([cols.topic], dtype=object))
        acc = np.full(n, one[0], dtype=np.uint64)
    else:
        acc = _hashes(topic, cols.topics)
    for field in (
        _partition(partition),
        _hashes(key, cols.keys),
        _hashes(value, cols.values),
        _headers(headers),
    ):
        acc = _combine(acc, field)
    return int(acc.sum(dtype=np.uint64))


def _hashes(arr: pa.Array, objects: Any = None) -> U64:
    """:func:`_siphash` of each string or binary of ``arr`` (``objects``: the same as Python
    objects, if converted already); nulls ``_NULL``."""
    if arr.null_count == len(arr):
        return np.full(len(arr), _NULL, dtype=np.uint64)
    out = _siphash(arr.to_numpy(zero_copy_only=False) if objects is None else objects)
    if arr.null_count:
        out[arr.is_null().to_numpy(zero_copy_only=False)] = _NULL
    return out


def _partition(arr: pa.Array) -> U64:
    """A record's partition: its 32 bits and a "present" bit; a null (any partition) 0."""
    if arr.null_count == len(arr):
        return np.zeros(len(arr), dtype=np.uint64)
    bits = arr.fill_null(0).to_numpy().astype(np.uint32).astype(np.uint64) | _PRESENT
    if arr.null_count:
        bits[arr.is_null().to_numpy(zero_copy_only=False)] = 0
    return _mix(bits)


def _headers(arr: pa.ListArray) -> U64:
    """A record's headers, in order: the sum of each header's hash salted with its
    position, combined with their count; a null list ``_NULL``."""
    n = len(arr)
    if arr.null_count == n:
        return np.full(n, _NULL, dtype=np.uint64)
    counts = pc.fill_null(arr.value_lengths(), 0).to_numpy().astype(np.int64)
    flat = arr.flatten()  # the listed headers only, slicing and null lists accounted for
    each = _combine(_hashes(flat.field("key")), _hashes(flat.field("value")))
    if flat.null_count:
        each[flat.is_null().to_numpy(zero_copy_only=False)] = _NULL
    ends = np.cumsum(counts)
    starts = ends - counts
    position = np.arange(len(flat), dtype=np.uint64) - np.repeat(starts, counts).astype(np.uint64)
    salted = _mix(each + position * _M)
    sums = np.zeros(len(flat) + 1, dtype=np.uint64)
    np.cumsum(salted, dtype=np.uint64, out=sums[1:])
    out = _combine(counts.astype(np.uint64), sums[ends] - sums[starts])
    if arr.null_count:
        out[arr.is_null().to_numpy(zero_copy_only=False)] = _NULL
    return out


# -- versions 1 and 2 (verify epochs decided with them; unchanged) --------------------------


def _crc(records: pa.RecordBatch, version: int) -> int:
    """A sum of per-record CRCs; version 2 covers every field that reaches Kafka (topic,
    partition, key, value, headers) and tells a null key or value from an empty one."""
    total = 0
    cols = [records.column(i).to_pylist() for i in range(records.num_columns)]
    for topic, partition, key, value, headers in zip(*cols, strict=True):
        if version == 1:
            h = zlib.crc32(value or b"", zlib.crc32(key or b"", zlib.crc32(topic.encode())))
        else:
            h = zlib.crc32(topic.encode())
            h = zlib.crc32(
                b"\xff" if partition is None else partition.to_bytes(4, "big", signed=True), h
            )
            h = zlib.crc32(b"\x00" if key is None else b"\x01" + key, h)
            h = zlib.crc32(b"\x00" if value is None else b"\x01" + value, h)
            for header in headers or ():
                h = zlib.crc32(header["value"] or b"", zlib.crc32(header["key"].encode(), h))
        total += h * 2654435761 + len(value or b"")
    return total % _MOD
