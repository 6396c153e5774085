"""The row digest: a count and an order-independent checksum of Arrow rows.

Every partition task digests the rows it hands to each sink (:mod:`txsink.protocol.task`),
and the decision records the digest next to each handle (:class:`Digest`, the handle
document's ``"evidence"``). An audit (:mod:`txsink.audit.found`) digests what a target holds
for an epoch the same way and compares: the count tells missing or extra rows, the sum
tells changed ones, the per-column sums name the column.

Order-independent because nothing keeps row order from the task to the target (Spark's
replay, a table's files, a Kafka partition's offsets): the digest of a set of rows is a
sum, mod 2**64, of one hash per row; the digests of two sets of rows add up to the digest
of their union (:meth:`Digest.__add__`), so an epoch's digest is the sum of its handles'.

Version 1 (the one written here; :data:`DIGEST_VERSION`), for a column named ``n`` whose
value in a row is ``v``:

* ``h(v)``: a 64-bit hash of the value's *canonical* form, so a value read back in another
  Arrow spelling hashes the same: every integer type as int64; float32 and float64 as
  float64 (``-0.0`` as ``0.0``, every NaN as one NaN); a decimal as its text without
  trailing zeros; strings and binaries by SipHash-2-4 (pandas' ``hash_array``, fixed key
  :data:`SIPHASH_KEY`), each with its own tag so ``"a"`` and ``b"a"`` differ; timestamps as
  microseconds since 1970 UTC (any unit, any time zone), dates as days, times and
  durations as microseconds; a dictionary as its values; a struct as the fold of its
  fields' ``t`` in name order; a list (or map) as its length and the sum of its elements'
  hashes salted by position; a null as the constant ``_NULL``.
* ``t(n, v) = combine(siphash(n), h(v))``; the column's sum ``cols[n] = Σ_rows t``.
* the row's hash: ``t`` of its columns folded with ``combine`` in name order; ``sum`` is
  ``Σ_rows`` of it. The fold binds a row's values together, so moving a value to another
  row changes ``sum``, and the column order does not matter.

What it cannot see: a change that keeps every hash (a 64-bit collision), and values below
the canonical form's resolution (nanoseconds, the scale of a decimal). ``tests/test_digest.py``
pins values of version 1; a new version keeps this one readable.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    import numpy.typing as npt

    U64 = npt.NDArray[np.uint64]

__all__ = [
    "DIGEST_VERSION",
    "SIPHASH_KEY",
    "Digest",
    "combine",
    "digest_batch",
    "digest_rows",
    "mix",
    "siphash",
]

#: The digest version new pre-commits record.
DIGEST_VERSION = 1
_MOD = 1 << 64
#: SipHash key of the string and binary hashes (16 bytes; the Kafka replay checksum's).
SIPHASH_KEY = "txsink-replay-v3"
#: The hash of a null value.
NULL = np.uint64(0x6E756C6C_7478736B)
#: The golden-ratio multiplier of :func:`combine`.
M = np.uint64(0x9E3779B97F4A7C15)
# One tag per canonical kind, so equal bits of different kinds hash apart.
_KINDS = [
    "bool",
    "int",
    "float",
    "decimal",
    "str",
    "bin",
    "ts",
    "date",
    "time",
    "dur",
    "struct",
    "list",
    "other",
]
_TAG = {k: np.uint64(i * 0x1000193 + 0x51ED270B) for i, k in enumerate(_KINDS, start=1)}


def mix(x: U64) -> U64:
    """The splitmix64 finaliser (a bijection of uint64), on a fresh array."""
    x = x ^ (x >> np.uint64(30))
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def combine(acc: U64, value: U64 | np.uint64) -> U64:
    """Fold ``value`` into ``acc``, element-wise (order matters: not symmetric)."""
    return mix((acc * M) ^ value)


def siphash(objects: Any) -> U64:
    """SipHash-2-4 (key :data:`SIPHASH_KEY`) of each ``str`` (UTF-8) or ``bytes`` of the
    object array ``objects``, through the splitmix64 finaliser: pandas' ``hash_array``."""
    from pandas.util import hash_array

    out: U64 = hash_array(objects, encoding="utf8", hash_key=SIPHASH_KEY, categorize=False)
    return out


@dataclass(frozen=True)
class Digest:
    """A count and order-independent checksums of rows (see the module's docstring).

    ``cols`` maps each column name to its sum; ``sum`` binds each row's columns together.
    Add two digests to get their union's (the columns must be the same ones).
    """

    rows: int = 0
    sum: int = 0
    cols: Mapping[str, int] = field(default_factory=dict)
    version: int = DIGEST_VERSION

    def __add__(self, other: Digest) -> Digest:
        if other.version != self.version:
            raise ValueError(f"cannot add digests of versions {self.version} and {other.version}")
        cols = dict(self.cols)
        for name, value in other.cols.items():
            cols[name] = (cols.get(name, 0) + value) % _MOD
        return Digest(self.rows + other.rows, (self.sum + other.sum) % _MOD, cols, self.version)

    @classmethod
    def total(cls, digests: Iterable[Digest]) -> Digest:
        out = cls()
        for one in digests:
            out = out + one
        return out

    def differing_columns(self, other: Digest) -> list[str]:
        """The columns whose sums differ (a column only one side has included)."""
        names = sorted(set(self.cols) | set(other.cols))
        return [n for n in names if self.cols.get(n) != other.cols.get(n)]

    def to_json(self) -> dict[str, Any]:
        """The decision's ``"evidence"`` document (sums as 16 hex digits: JSON numbers lose
        precision above 2**53 in many readers)."""
        return {
            "v": self.version,
            "rows": self.rows,
            "sum": f"{self.sum:016x}",
            "cols": {n: f"{s:016x}" for n, s in sorted(self.cols.items())},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Digest:
        version = int(doc.get("v", 0))
        if version != DIGEST_VERSION:
            raise ValueError(
                f"row digest version {version!r}: this txsink reads version {DIGEST_VERSION}"
            )
        return cls(
            int(doc["rows"]),
            int(str(doc["sum"]), 16),
            {str(n): int(str(s), 16) for n, s in dict(doc.get("cols", {})).items()},
            version,
        )

    def text(self) -> str:
        return f"{self.rows} rows, sum {self.sum:016x}"


def digest_batch(batch: pa.RecordBatch | pa.Table) -> Digest:
    """The :class:`Digest` of every row of ``batch`` (a table's chunks are digested as one)."""
    n = batch.num_rows
    if n == 0:
        return Digest(cols={name: 0 for name in batch.schema.names})
    names = batch.schema.names
    order = sorted(range(len(names)), key=lambda i: names[i])
    keys = siphash(np.array([names[i] for i in order], dtype=object))
    acc = np.full(n, np.uint64(len(names)), dtype=np.uint64)
    cols: dict[str, int] = {}
    for key, i in zip(keys, order, strict=True):
        column = batch.column(i)
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        t = combine(np.full(n, key, dtype=np.uint64), value_hashes(arr))
        cols[names[i]] = int(t.sum(dtype=np.uint64))
        acc = combine(acc, t)
    return Digest(n, int(acc.sum(dtype=np.uint64)), cols)


def digest_rows(batches: Iterable[pa.RecordBatch | pa.Table]) -> Digest:
    """The :class:`Digest` of the rows of every batch together."""
    return Digest.total(digest_batch(b) for b in batches)


# -- canonical value hashes ----------------------------------------------------------------


def value_hashes(arr: pa.Array) -> U64:
    """One uint64 per element of ``arr``: the hash of its canonical value (nulls ``NULL``)."""
    n = len(arr)
    t = arr.type
    if pa.types.is_dictionary(t):
        return value_hashes(arr.dictionary_decode())
    if isinstance(t, pa.ExtensionType):
        return value_hashes(arr.storage)
    if pa.types.is_null(t) or arr.null_count == n:
        return np.full(n, NULL, dtype=np.uint64)
    out = _hash_valid(arr, t)
    if arr.null_count:
        out[arr.is_null().to_numpy(zero_copy_only=False)] = NULL
    return out


def _ints(arr: pa.Array) -> U64:
    out: U64 = arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
    return out


def _hash_valid(arr: pa.Array, t: pa.DataType) -> U64:
    if pa.types.is_boolean(t):
        return mix(
            arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64) ^ _TAG["bool"]
        )
    if pa.types.is_integer(t):
        return mix(_ints(arr) ^ _TAG["int"])
    if pa.types.is_floating(t):
        values = arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64) + 0.0
        values[np.isnan(values)] = np.nan  # one NaN
        return mix(values.view(np.uint64) ^ _TAG["float"])
    if pa.types.is_decimal(t):
        return _decimals(arr)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or _is_view(t, "string_view"):
        return combine(siphash(arr.to_numpy(zero_copy_only=False)), _TAG["str"])
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or _is_view(t, "binary_view"):  # fmt: skip  # noqa: E501
        return combine(siphash(arr.to_numpy(zero_copy_only=False)), _TAG["bin"])
    if pa.types.is_timestamp(t):
        return mix(_micros(arr, t.unit) ^ _TAG["ts"])
    if pa.types.is_date32(t):
        return mix(_ints(arr.cast(pa.int32())) ^ _TAG["date"])
    if pa.types.is_date64(t):
        days = _ints(arr.cast(pa.int64())).view(np.int64) // 86_400_000
        return mix(days.view(np.uint64) ^ _TAG["date"])
    if pa.types.is_time(t):
        return mix(_micros(arr, t.unit) ^ _TAG["time"])
    if pa.types.is_duration(t):
        return mix(_micros(arr, t.unit) ^ _TAG["dur"])
    if pa.types.is_struct(t):
        return _struct(arr)
    if (
        pa.types.is_list(t)
        or pa.types.is_map(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
    ):
        return _list(_entries(arr) if pa.types.is_map(t) else arr)
    return _other(arr)


def _is_view(t: pa.DataType, name: str) -> bool:
    test = getattr(pa.types, f"is_{name}", None)
    return bool(test(t)) if test is not None else False


_PER_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}


def _micros(arr: pa.Array, unit: str) -> U64:
    raw = _ints(arr.cast(pa.int64())).view(np.int64)
    us = raw // 1_000 if unit == "ns" else raw * _PER_US[unit]
    return us.view(np.uint64)


def _decimals(arr: pa.Array) -> U64:
    """A decimal's text without trailing zeros (``1.50`` and ``1.5`` hash the same)."""
    text = [None if v is None else _decimal_text(v) for v in arr.to_pylist()]
    return combine(siphash(np.array(text, dtype=object)), _TAG["decimal"])


def _decimal_text(value: decimal.Decimal) -> str:
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


def _struct(arr: pa.StructArray) -> U64:
    n = len(arr)
    fields = sorted(range(arr.type.num_fields), key=lambda i: arr.type.field(i).name)
    children = arr.flatten()  # the parent's offset applied
    keys = siphash(np.array([arr.type.field(i).name for i in fields], dtype=object))
    acc = np.full(n, np.uint64(len(fields)) ^ _TAG["struct"], dtype=np.uint64)
    for key, i in zip(keys, fields, strict=True):
        acc = combine(acc, combine(np.full(n, key, dtype=np.uint64), value_hashes(children[i])))
    return acc


def _list(arr: pa.Array) -> U64:
    """A list's length and the sum of its elements' hashes salted by position."""
    counts = pc.fill_null(pc.list_value_length(arr), 0).to_numpy().astype(np.int64)
    flat = pc.list_flatten(arr)  # the listed values only, slicing and null lists accounted for
    each = value_hashes(flat)
    ends = np.cumsum(counts)
    starts = ends - counts
    position = np.arange(len(flat), dtype=np.uint64) - np.repeat(starts, counts).astype(np.uint64)
    salted = mix(each + position * M)
    sums = np.zeros(len(flat) + 1, dtype=np.uint64)
    np.cumsum(salted, dtype=np.uint64, out=sums[1:])
    return combine(counts.astype(np.uint64) ^ _TAG["list"], sums[ends] - sums[starts])


def _entries(arr: pa.MapArray) -> pa.Array:
    """A map as the list of its (key, value) entries."""
    entries = pa.StructArray.from_arrays([arr.keys, arr.items], names=["key", "value"])
    if len(entries) != arr.offsets[-1].as_py():  # the children sliced with the map
        entries = pa.concat_arrays([pa.nulls(arr.offsets[0].as_py(), entries.type), entries])
    return pa.ListArray.from_arrays(arr.offsets, entries)  # its nulls: value_hashes


def _other(arr: pa.Array) -> U64:
    """Any other type: its text (a cast Arrow knows), else each value's ``repr``."""
    try:
        text = arr.cast(pa.string()).to_numpy(zero_copy_only=False)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        text = np.array([repr(v) for v in arr.to_pylist()], dtype=object)
    return combine(siphash(text), _TAG["other"])
