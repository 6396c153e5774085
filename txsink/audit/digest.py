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

Version 1 (the one written here; :data:`DIGEST_VERSION`), for a column named ``n`` of kind
``k`` whose value in a row is ``v``:

* ``raw(v)``: 64 bits of the value's *canonical* form (:mod:`txsink.audit.canonical`), so a
  value read back in another Arrow spelling gives the same bits: every integer as int64,
  every float as float64, a decimal at scale 18, strings and binaries by their bytes'
  hash, timestamps as UTC microseconds, nested values by their elements' hashes.
* ``t(n, v) = mix(raw(v) ^ key(n) ^ tag(k))``, ``key(n)`` the hash of the name's UTF-8 and
  ``tag(k)`` the kind's (so ``"a"`` and ``b"a"``, or 1 and 1.0, differ); a null's ``raw``
  is ``NULL ^ tag(k)``: a null is the same in any type. The column's sum
  ``cols[n] = Σ_rows t``.
* the row's state folds its columns' ``t`` in name order (``s = s * M ^ t``, from the
  number of columns) and its hash is ``mix(s)``; ``sum = Σ_rows mix(s)``. The fold binds a
  row's values together: moving a value to another row changes ``sum``, not ``cols``.

Computed by compiled loops over Arrow's buffers (:mod:`txsink.audit.kernels`): about 30 ms
of one core per million rows of six mixed columns (docs/benchmarks.md).

What it cannot see: a change that keeps every hash (a 64-bit collision), and values below
the canonical form's resolution (nanoseconds). It is a checksum, not a signature.
``tests/test_digest.py`` pins values of version 1; a new version keeps this one readable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

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
#: SipHash key of :func:`siphash` (16 bytes; the Kafka replay checksum's).
SIPHASH_KEY = "txsink-replay-v3"
#: The hash of a null value.
NULL = np.uint64(0x6E756C6C_7478736B)
#: The golden-ratio multiplier of :func:`combine`.
M = np.uint64(0x9E3779B97F4A7C15)


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
    """The :class:`Digest` of every row of ``batch`` (a table chunk by chunk)."""
    if isinstance(batch, pa.Table):
        return (
            Digest.total(digest_batch(b) for b in batch.to_batches())
            if batch.num_rows
            else Digest(cols={c: 0 for c in batch.schema.names})
        )
    n = batch.num_rows
    schema = batch.schema
    if n == 0:
        return Digest(cols={name: 0 for name in schema.names})
    from txsink.audit import canonical, kernels

    acc, out = _scratch(n)
    acc[0] = batch.num_columns  # every row's initial state (fold's first)
    cols: dict[str, int] = {}
    for j, (i, name, key, read) in enumerate(_plan(schema)):
        col = read(batch.column(i), out)  # consumed by the fold before the next column
        tag = canonical.TAG.get(col.kind, canonical.TAG["other"])
        total = kernels.fold(
            col.raw, col.bits, col.offset, col.nulls, key ^ tag, NULL ^ tag, acc, j == 0
        )
        cols[name] = int(total)
    return Digest(n, int(kernels.mixed_sum(acc)), cols)


_local = threading.local()
#: Batches up to this many rows reuse the thread's two scratch arrays (16 bytes a row).
SCRATCH_ROWS = 1 << 18


def _scratch(n: int) -> tuple[U64, U64]:
    """Two uint64 arrays of ``n``: the rows' states and a column's raw bits. Reused batch
    after batch (up to :data:`SCRATCH_ROWS`) because a fresh array's pages fault in after a
    sink's write has freed its buffers: with a Parquet write between batches, filling a
    fresh 80 KB array took 25 µs, against 4 µs without the write."""
    held = getattr(_local, "scratch", None)
    if n > SCRATCH_ROWS:
        return np.empty(n, np.uint64), np.empty(n, np.uint64)
    if held is None or len(held[0]) < n:
        held = _local.scratch = (np.empty(n, np.uint64), np.empty(n, np.uint64))
    return held[0][:n], held[1][:n]


#: The last schema digested and its plan (one task's batches share one schema). Replaced
#: whole, so a reader in another thread sees one pair or the other.
_last_plan: list[tuple[pa.Schema | None, tuple[Any, ...]]] = [(None, ())]


def _plan(schema: pa.Schema) -> tuple[tuple[int, str, np.uint64, Any], ...]:
    """Each column's index, name, key and :func:`~txsink.audit.canonical.reader`, in name
    order: made once per schema, not per batch (comparing a schema costs far less than the
    type questions it saves)."""
    from txsink.audit import canonical

    last, plan = _last_plan[0]
    if last is not None and last == schema:
        return plan
    names = schema.names
    order = sorted(range(len(names)), key=lambda i: names[i])
    keys = canonical.name_keys([names[i] for i in order])
    plan = tuple(
        (i, names[i], key, canonical.reader(schema.field(i).type))
        for key, i in zip(keys, order, strict=True)
    )
    _last_plan[0] = (schema, plan)
    return plan


def digest_rows(batches: Iterable[pa.RecordBatch | pa.Table]) -> Digest:
    """The :class:`Digest` of the rows of every batch together."""
    return Digest.total(digest_batch(b) for b in batches)
