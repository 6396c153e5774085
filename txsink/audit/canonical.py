"""Each value's canonical 64 bits, per column, for the row digest (:mod:`txsink.audit.digest`).

A value read back from a target in another Arrow spelling must give the same bits: the
*kind* of a column (int, float, decimal, str, bin, ts, date, time, dur, bool, struct,
list, other) and its canonical form decide them, never the Arrow type's width or unit:

========  ================================================================================
int       any integer type, as int64 (uint64 above 2**63 wraps)
float     float16/32/64 as float64; ``-0.0`` as ``0.0``; every NaN as one NaN
decimal   the value at scale 18 as a 128-bit integer (two words, :func:`kernels.hash_pairs`);
          a value that does not fit (more than 20 integer or 18 fraction digits): its text
          without trailing zeros
str, bin  :func:`kernels.hash_bytes` of the UTF-8 text or the bytes (any offset width, views)
ts        microseconds since 1970 UTC, any unit and zone (nanoseconds floored)
date      days since 1970; ``time``, ``dur``: microseconds
struct    its fields' hashes folded in name order; ``list``: its length and its elements'
          hashes salted by position (a map: a list of its entries)
========  ================================================================================

Fixed-width values are read from Arrow's buffers without a copy where the type allows it;
strings from their offsets and data buffers; nothing becomes a Python object but the rare
oversized decimal and the ``other`` kinds.
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txsink.audit import kernels
from txsink.audit.kernels import u64

if TYPE_CHECKING:
    import numpy.typing as npt

    U64 = npt.NDArray[np.uint64]

__all__ = ["NULL", "TAG", "Column", "Reader", "column", "reader", "value_hashes"]

#: The raw bits of a null value.
NULL = np.uint64(0x6E756C6C_7478736B)
_M = np.uint64(0x9E3779B97F4A7C15)
_KINDS: tuple[str, ...] = ("bool", "int", "float", "decimal", "str", "bin", "ts", "date")
_KINDS += ("time", "dur", "struct", "list", "other", "bigdecimal")
#: One tag per kind, so equal bits of different kinds hash apart.
TAG = {k: np.uint64(i * 0x1000193 + 0x51ED270B) for i, k in enumerate(_KINDS, start=1)}
_NO_BITS = np.zeros(0, dtype=np.uint8)
_DEC = pa.decimal128(38, 18)
_PER_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}


class Column(NamedTuple):
    """One array's canonical bits: ``raw`` (uint64, one per value; a null's is garbage),
    its ``kind``, and where its validity bits are (``nulls`` False: no null)."""

    raw: U64
    kind: str
    bits: Any
    offset: int
    nulls: bool


def column(arr: pa.Array) -> Column:
    """The canonical bits of every value of ``arr`` (see the module's table)."""
    return reader(arr.type)(arr, None)


#: What :func:`reader` returns: ``read(arr, out)``, ``out`` a uint64 array of ``len(arr)``
#: the raw bits may be written to (the returned column's ``raw`` may be it), or None.
Reader = Callable[[pa.Array, "U64 | None"], Column]
_Raw = Callable[[pa.Array, "U64"], "U64"]


def reader(t: pa.DataType) -> Reader:
    """:func:`column` for arrays of type ``t``, the type's questions answered once: a task
    digests batch after batch of one schema, and asking them per batch cost a fifth of a
    short string column's digest. ``out``: see :data:`Reader` (the row digest passes the
    same scratch array for every column: fresh arrays cost page faults after a sink's
    write has freed its own)."""
    if pa.types.is_dictionary(t):
        return _decoded
    if isinstance(t, pa.ExtensionType):
        return _storage
    kind, raw = _raw(t)
    return functools.partial(_read, kind, raw)


def _decoded(arr: pa.DictionaryArray, out: U64 | None) -> Column:
    return column(arr.dictionary_decode())


def _storage(arr: pa.ExtensionArray, out: U64 | None) -> Column:
    return column(arr.storage)


def _read(kind: str, raw: _Raw, arr: pa.Array, out: U64 | None) -> Column:
    n = len(arr)
    nulls = arr.null_count
    if kind == "null" or (n and nulls == n):
        return Column(np.zeros(n, np.uint64), kind, np.zeros((n + 7) // 8, np.uint8), 0, True)
    values = raw(arr, np.empty(n, np.uint64) if out is None else out)
    validity = arr.buffers()[0] if nulls else None
    if validity is None:
        return Column(values, kind, _NO_BITS, 0, False)
    return Column(values, kind, np.frombuffer(validity, np.uint8), arr.offset, True)


def value_hashes(arr: pa.Array) -> U64:
    """Each value's full hash, ``mix(raw ^ TAG[kind])`` (a null: :data:`NULL`): the
    elements of structs and lists."""
    col = column(arr)
    out = np.empty(len(arr), dtype=np.uint64)
    tag = TAG.get(col.kind, TAG["other"])
    kernels.hashes(col.raw, col.bits, col.offset, col.nulls, tag, NULL ^ tag, out)
    if arr.null_count:
        out[arr.is_null().to_numpy(zero_copy_only=False)] = NULL
    return out


def _kind(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or _is(t, "string_view"):
        return "str"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or _is(t, "binary_view"):
        return "bin"
    if pa.types.is_fixed_size_binary(t):
        return "bin"
    if pa.types.is_timestamp(t):
        return "ts"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_time(t):
        return "time"
    if pa.types.is_duration(t):
        return "dur"
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return "list"
    if pa.types.is_map(t):
        return "list"
    return "null" if pa.types.is_null(t) else "other"


def _is(t: pa.DataType, name: str) -> bool:
    test = getattr(pa.types, f"is_{name}", None)
    return bool(test(t)) if test is not None else False


def _raw(t: pa.DataType) -> tuple[str, _Raw]:
    """The kind of ``t`` and ``raw(arr, out)``, an array's raw bits (null slots: any),
    written to ``out`` (a uint64 array of ``len(arr)``) or a view of Arrow's buffer."""
    kind = _kind(t)
    if kind == "int":
        return kind, functools.partial(_ints, t.to_pandas_dtype())
    if kind == "float":
        return kind, functools.partial(_floats, t.to_pandas_dtype())
    if kind in ("ts", "time", "dur"):
        return kind, functools.partial(_micros, np.int32 if t.bit_width == 32 else np.int64, t.unit)
    if kind == "date":
        return kind, _days if pa.types.is_date32(t) else _days_from_ms
    if kind in ("str", "bin"):
        return kind, _bytes_reader(t)
    if kind == "decimal":
        return kind, _decimals
    nested: Callable[[pa.Array], U64] = {"bool": _bools, "struct": _struct}.get(kind, _other)
    if kind == "list":
        nested = (lambda arr: _list(_entries(arr))) if pa.types.is_map(t) else _list
    elif kind == "null":
        nested = lambda arr: np.zeros(len(arr), np.uint64)  # noqa: E731
    return kind, lambda arr, out: nested(arr)  # these allocate their own


def _ints(dtype: Any, arr: pa.Array, out: U64) -> U64:
    return _as_int64(_values(arr, dtype), out)


def _as_int64(values: Any, out: U64) -> U64:
    """Integers as int64 bits: a 64-bit buffer as it is, narrower ones widened into ``out``."""
    if values.dtype.itemsize == 8:
        return u64(values)
    np.copyto(out.view(np.int64), values, casting="unsafe")
    return out


def _floats(dtype: Any, arr: pa.Array, out: U64) -> U64:
    values = _values(arr, dtype)
    if values.dtype.itemsize == 2:  # float16: numba has no loop for it
        values = values.astype(np.float32)
    kernels.canonical_floats(values, out.view(np.float64))
    return out


def _days(arr: pa.Array, out: U64) -> U64:
    return _as_int64(_values(arr, np.int32), out)


def _days_from_ms(arr: pa.Array, out: U64) -> U64:
    np.floor_divide(_values(arr, np.int64), 86_400_000, out=out.view(np.int64))
    return out


def _bools(arr: pa.Array) -> U64:
    return u64(arr.cast(pa.uint8()).fill_null(0).to_numpy())


def _values(arr: pa.Array, dtype: Any) -> Any:
    """The values buffer as numpy, no copy (a null's slot holds whatever Arrow left)."""
    n = len(arr)
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(n, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype)[arr.offset : arr.offset + n]


def _micros(dtype: Any, unit: str, arr: pa.Array, out: U64) -> U64:
    values = _values(arr, dtype)
    if unit == "us":
        return _as_int64(values, out)
    if unit == "ns":
        np.floor_divide(values, 1_000, out=out.view(np.int64))
    else:
        np.multiply(values, _PER_US[unit], out=out.view(np.int64), dtype=np.int64)
    return out


def _bytes_reader(t: pa.DataType) -> _Raw:
    """:func:`_bytes` for arrays of type ``t`` (views read as their large type: a cast)."""
    if _is(t, "string_view") or _is(t, "binary_view"):
        wide = pa.large_string() if _is(t, "string_view") else pa.large_binary()
        return lambda arr, out: _bytes(wide, arr.cast(wide), out)
    return functools.partial(_bytes, t)


def _bytes(t: pa.DataType, arr: pa.Array, out: U64 | None = None) -> U64:
    """:func:`kernels.hash_bytes` of each value's bytes, from Arrow's buffers (``t``: not a
    view type), into ``out`` (a fresh array if None)."""
    n = len(arr)
    out = np.empty(n, dtype=np.uint64) if out is None else out
    buffers = arr.buffers()
    if pa.types.is_fixed_size_binary(t):
        width = t.byte_width
        data = np.frombuffer(buffers[1], np.uint8) if buffers[1] is not None else _NO_BITS
        offsets = (np.arange(n + 1, dtype=np.int64) + arr.offset) * width
    else:
        wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        offsets = np.frombuffer(buffers[1], np.int64 if wide else np.int32)
        offsets = offsets[arr.offset : arr.offset + n + 1]
        data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else _NO_BITS
    kernels.hash_bytes(offsets, data, out)
    return out


def _decimals(arr: pa.Array, out: U64) -> U64:
    """Each decimal at scale 18 as a 128-bit integer; if one does not fit, the column's
    values one by one (a value that fits gives the same bits either way)."""
    t = arr.type
    if pa.types.is_decimal128(t) and t.precision <= 18 and 0 <= t.scale <= 18:
        n = len(arr)
        words = np.frombuffer(arr.buffers()[1], np.uint64)[2 * arr.offset : 2 * (arr.offset + n)]
        kernels.hash_small_decimals(words, np.uint64(10 ** (18 - t.scale)), out)
        return out
    try:
        at18 = arr.cast(_DEC)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _decimals_one_by_one(arr)
    n = len(at18)
    words = np.frombuffer(at18.buffers()[1], np.uint64)[2 * at18.offset : 2 * (at18.offset + n)]
    kernels.hash_pairs(words, out)
    return out


def _decimals_one_by_one(arr: pa.Array) -> U64:
    out = np.zeros(len(arr), dtype=np.uint64)
    for i, value in enumerate(arr.to_pylist()):
        if value is None:
            continue
        scaled = value.scaleb(18)
        if scaled == scaled.to_integral_value() and abs(scaled) < 10**38:
            unscaled = int(scaled) & ((1 << 128) - 1)  # two's complement, as Arrow keeps it
            words = np.array([unscaled & (2**64 - 1), unscaled >> 64], dtype=np.uint64)
            one = np.empty(1, dtype=np.uint64)
            kernels.hash_pairs(words, one)
            out[i] = one[0]
        else:
            text = _decimal_text(value).encode()
            one = np.empty(1, dtype=np.uint64)
            raw = np.frombuffer(text, np.uint8)
            kernels.hash_bytes(np.array([0, len(text)]), raw, one)
            out[i] = one[0] ^ TAG["bigdecimal"]
    return out


def _decimal_text(value: decimal.Decimal) -> str:
    return "0" if value == 0 else format(value.normalize(), "f")


def _struct(arr: pa.StructArray) -> U64:
    n = len(arr)
    fields = sorted(range(arr.type.num_fields), key=lambda i: arr.type.field(i).name)
    children = arr.flatten()  # the parent's offset applied
    names = [arr.type.field(i).name.encode() for i in fields]
    keys = _name_keys(names)
    acc = np.full(n, np.uint64(len(fields)) ^ TAG["struct"], dtype=np.uint64)
    for key, i in zip(keys, fields, strict=True):
        kernels.fold(value_hashes(children[i]), _NO_BITS, 0, False, key, NULL, acc)
    return kernels.mix_np(acc)


def _list(arr: pa.Array) -> U64:
    """A list's length and the sum of its elements' hashes salted by position."""
    counts = pc.fill_null(pc.list_value_length(arr), 0).to_numpy().astype(np.int64)
    flat = pc.list_flatten(arr)  # the listed values only, slicing and null lists accounted for
    each = value_hashes(flat)
    ends = np.cumsum(counts)
    starts = ends - counts
    position = np.arange(len(flat), dtype=np.uint64) - np.repeat(starts, counts).astype(np.uint64)
    salted = kernels.mix_np(each + position * _M)
    sums = np.zeros(len(flat) + 1, dtype=np.uint64)
    np.cumsum(salted, dtype=np.uint64, out=sums[1:])
    length = kernels.mix_np(counts.astype(np.uint64) ^ TAG["list"])
    return kernels.mix_np((length * _M) ^ (sums[ends] - sums[starts]))


def _entries(arr: pa.MapArray) -> pa.Array:
    """A map as the list of its (key, value) entries."""
    entries = pa.StructArray.from_arrays([arr.keys, arr.items], names=["key", "value"])
    if len(entries) != arr.offsets[-1].as_py():  # the children sliced with the map
        entries = pa.concat_arrays([pa.nulls(arr.offsets[0].as_py(), entries.type), entries])
    return pa.ListArray.from_arrays(arr.offsets, entries)  # its nulls: value_hashes


def _other(arr: pa.Array) -> U64:
    """Any other type: its text (a cast Arrow knows), else each value's ``repr``."""
    try:
        text = arr.cast(pa.large_string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        text = pa.array([repr(v) for v in arr.to_pylist()], pa.large_string())
    return _bytes(text.type, text.fill_null(""))


def name_keys(names: list[str]) -> U64:
    """Each column name's key (:func:`kernels.hash_bytes` of its UTF-8)."""
    return _name_keys([n.encode() for n in names])


def _name_keys(names: list[bytes]) -> U64:
    offsets = np.cumsum([0, *(len(n) for n in names)], dtype=np.int64)
    out = np.empty(len(names), dtype=np.uint64)
    data = np.frombuffer(b"".join(names) or b"\0", np.uint8)
    kernels.hash_bytes(offsets, data, out)
    return out
