"""The row digest's inner loops, compiled (numba): one pass over Arrow's buffers per column.

Why compiled: the digest runs over every row of every pre-commit, and must cost a few
per cent of it (issue #42). A numpy expression makes one pass over memory per operation
(a 64-bit mix is five), and strings needed Python objects for pandas' SipHash: the first
version cost as much as writing the Parquet file. Here each column is one loop that reads
the values and the validity bits where Arrow keeps them, and folds each value into its
column's sum and its row's hash at once.

The functions are pure: the same bits in, the same sums out, on any machine (uint64
arithmetic wraps; no floating point is computed). ``cache=True`` keeps the machine code
beside this file, so a Spark Python worker compiles once, not per task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

if TYPE_CHECKING:
    import numpy.typing as npt

    U64 = npt.NDArray[np.uint64]

__all__ = [
    "canonical_floats",
    "fold",
    "hash_bytes",
    "hash_pairs",
    "hash_small_decimals",
    "hashes",
    "mix_np",
    "mixed_sum",
    "u64",
]


_M = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_S3, _B7, _ONE = np.uint64(3), np.uint64(7), np.uint64(1)
_SEED = np.uint64(0x7478736B62797465)  # the length's salt in hash_bytes
_TAIL = np.uint64(0x7461696C7478736B)  # marks the last word of a value
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


@njit(cache=True, inline="always")
def _mix(x: np.uint64) -> np.uint64:
    """splitmix64's finaliser: a bijection of uint64 (the same as txsink.audit.digest.mix)."""
    x = x ^ (x >> _S30)
    x = x * _C1
    x = x ^ (x >> _S27)
    x = x * _C2
    return x ^ (x >> _S31)


@njit(cache=True, inline="always")
def _valid(bits: Any, offset: int, i: int) -> bool:
    j = np.uint64(offset + i)
    return bool((np.uint64(bits[j >> _S3]) >> (j & _B7)) & _ONE)


@njit(cache=True, nogil=True)
def fold(  # noqa: PLR0917 (a compiled kernel takes its arguments in order)
    raw: Any,
    bits: Any,
    offset: int,
    nulls: bool,
    key: np.uint64,
    null: np.uint64,
    acc: Any,
    first: bool = False,
) -> np.uint64:
    """Fold one column into the rows' states ``acc`` (in place); return the column's sum.

    ``raw``: each value's 64 canonical bits (uint64); ``bits``/``offset``: Arrow's validity
    bitmap and the array's offset in it (``nulls`` False: no bitmap to read); ``key``: the
    column's key (its name's hash and its kind's tag); ``null``: what a null value is.
    Each value's ``t = mix(raw ^ key)`` is added to the sum and folded into its row's
    state (``acc = acc * M ^ t``: order matters); the row's hash is ``mix`` of its state once
    every column is in (:func:`mixed_sum`), which binds the row's values together.

    ``first``: every row's state is ``acc[0]`` (the first column: the caller sets one value
    instead of filling the array, a pass less over memory a sink's write has just evicted)."""
    total = np.uint64(0)
    start = acc[0] * _M
    for i in range(raw.shape[0]):
        v = raw[i]
        if nulls and not _valid(bits, offset, i):
            v = null
        t = _mix(v ^ key)
        total += t
        acc[i] = (start if first else acc[i] * _M) ^ t
    return total


@njit(cache=True, nogil=True)
def mixed_sum(acc: Any) -> np.uint64:
    """``Σ mix(acc[i])``: the rows' hashes from their states, summed (the digest's ``sum``)."""
    total = np.uint64(0)
    for i in range(acc.shape[0]):
        total += _mix(acc[i])
    return total


@njit(cache=True, nogil=True)
def hashes(  # noqa: PLR0917
    raw: Any, bits: Any, offset: int, nulls: bool, key: np.uint64, null: np.uint64, out: Any
) -> None:
    """``out[i] = mix(raw[i] ^ key)``, a null's ``raw`` read as ``null`` (as :func:`fold`,
    without the fold: a nested value's elements)."""
    for i in range(raw.shape[0]):
        v = raw[i]
        if nulls and not _valid(bits, offset, i):
            v = null
        out[i] = _mix(v ^ key)


def _unaligned_u64(typingctx: Any, data: Any, p: Any) -> Any:
    """The 8 bytes of the uint8 array ``data`` from byte ``p``, as one unaligned load in
    the machine's order (little-endian: the x86-64 and arm64 machines Spark runs on). No
    bounds check: the caller keeps ``p + 8`` within the array. (numba offers no such load;
    an intrinsic writes it in numba's own IR builder.)"""
    sig = types.uint64(data, p)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        at = context.cast(builder, args[1], signature.args[1], types.intp)
        word = context.get_value_type(types.uint64).as_pointer()
        return builder.load(builder.bitcast(builder.gep(array.data, [at]), word), align=1)

    return sig, codegen


_load8: Any = intrinsic(_unaligned_u64)


@njit(cache=True, inline="always")
def _word(data: Any, p: int) -> np.uint64:
    """The 8 bytes from byte ``p``, little-endian (bytes past the buffer's end read as 0):
    one load wherever the value starts (values of varying lengths start anywhere: reading
    a word through a choice of aligned views mispredicts on most of them); byte by byte
    only within the buffer's last 8 bytes."""
    size = data.shape[0]
    if p + 8 <= size:
        w: np.uint64 = _load8(data, p)
        return w
    w = np.uint64(0)
    for k in range(size - p):
        w |= np.uint64(data[p + k]) << np.uint64(8 * k)
    return w


@njit(cache=True, nogil=True)
def hash_bytes(offsets: Any, data: Any, out: Any) -> None:
    """``out[i]``: a 64-bit hash of value ``i``'s bytes ``data[offsets[i]:offsets[i+1]]``
    (Arrow's string and binary layout; ``data`` a uint8 array): its length, then its
    8-byte little-endian words, each but the last mixed in; the last (1 to 8 bytes, zero
    padded) is marked and folded in *unmixed*. Not cryptographic.

    Why the last word stays unmixed: every user mixes the result once more with the column's
    key (:func:`fold`, :func:`hashes`), and one mix fewer is a third of a short string's cost.
    Each step is a bijection of the state and of the word, so values of one length that
    differ in one word never collide."""
    for i in range(out.shape[0]):
        start, end = offsets[i], offsets[i + 1]
        h = (np.uint64(end - start) * _M) ^ _SEED
        p = start
        while p + 8 < end:
            h = _mix((h * _M) ^ _word(data, p))
            p += 8
        if p < end:
            w = _word(data, p) & (_ALL >> np.uint64(64 - 8 * (end - p)))
            h = (h * _M) ^ w ^ _TAIL
        out[i] = h


@njit(cache=True, nogil=True)
def hash_pairs(words: Any, out: Any) -> None:
    """``out[i]``: the two 64-bit words ``words[2i]`` (low) and ``words[2i+1]`` (high) of a
    128-bit value (a decimal's unscaled integer) as one, ``low ^ high * M``: unmixed, as
    an integer's raw bits are (:func:`fold` mixes them with the column's key). Values that
    share a high word never collide (small ones: high is 0 or all ones)."""
    for i in range(out.shape[0]):
        out[i] = words[2 * i] ^ (words[2 * i + 1] * _M)


@njit(cache=True, nogil=True)
def canonical_floats(values: Any, out: Any) -> None:
    """``out[i]``: ``values[i]`` as float64 with ``-0.0`` as ``0.0`` (``x + 0.0``; numba
    compiles without fast-math, so it is kept) and every NaN as one NaN."""
    for i in range(values.shape[0]):
        v = np.float64(values[i]) + 0.0
        out[i] = np.nan if np.isnan(v) else v


def mix_np(x: U64) -> U64:
    """:func:`_mix` over a numpy array (a fresh one), for the rare nested values."""
    x = x ^ (x >> _S30)
    x = x * _C1
    x ^= x >> _S27
    x *= _C2
    out: U64 = x ^ (x >> _S31)
    return out


_LOW32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


@njit(cache=True, nogil=True)
def hash_small_decimals(words: Any, multiplier: np.uint64, out: Any) -> None:
    """:func:`hash_pairs` of decimals of precision up to 18 (their unscaled value fits an
    int64: the low word of each 16-byte value), brought to scale 18 by ``multiplier``
    (``10 ** (18 - scale)``) here, in 128-bit arithmetic, instead of Arrow's cast: the same
    two words the cast would give (two's complement), at a fraction of its cost.

    Without a branch (the sign is a mask: negate, multiply, negate back), so the compiler
    runs several values at once."""
    m_lo, m_hi = multiplier & _LOW32, multiplier >> _S32
    for i in range(out.shape[0]):
        x = words[2 * i]
        sign = np.uint64(np.int64(x) >> 63)  # all ones if negative
        a = (x ^ sign) - sign  # |x| (-(-2**63) wraps to 2**63: right)
        a_lo, a_hi = a & _LOW32, a >> _S32
        p0, p1, p2, p3 = a_lo * m_lo, a_lo * m_hi, a_hi * m_lo, a_hi * m_hi
        middle = (p0 >> _S32) + (p1 & _LOW32) + (p2 & _LOW32)
        lo = (p0 & _LOW32) | (middle << _S32)
        hi = p3 + (p1 >> _S32) + (p2 >> _S32) + (middle >> _S32)
        lo = (lo ^ sign) - sign  # the 128-bit two's complement if negative: ~lo + 1 ...
        hi = (hi ^ sign) + (np.uint64(lo == 0) & sign & _ONE)  # ... carried into ~hi
        out[i] = lo ^ (hi * _M)  # as hash_pairs


def u64(values: Any) -> U64:
    """``values`` (any integer numpy array) as uint64 bits, without a copy where it can."""
    out: U64 = np.ascontiguousarray(values).astype(np.int64, copy=False).view(np.uint64)
    return out
