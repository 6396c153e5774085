"""A rejected row, named by what identifies it: its key, not its position in a Spark task.

A row's position within a Spark partition means nothing to a user after a
``repartition`` (Spark deals rows out again on every run), so every error that names a
row names it by the sink's key columns and their values (Kafka's ``key``, Postgres's
primary or upsert key), else by the first columns of the row, cut to about
:data:`MAX_TEXT` characters; the partition and the row's offset within it come after,
for the executor's log. With ``redact_rows=True`` (a sink option) only the column
names and a hash of the values are printed: the error lands in driver logs, Spark's UI
and alerting systems, which sensitive data must not reach.

Connectors build one with :meth:`RowRef.of` from the batch they were writing; a
connector that learns of a bad row only later (a server that checks rows at the end of
a bulk load) keeps the identifying columns of what it sent in a :class:`RowNames`.
A ``RowRef`` holds plain strings only, so errors carrying it pickle across processes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["MAX_TEXT", "RowNames", "RowNaming", "RowRef"]

#: About how many characters of values a row's name shows.
MAX_TEXT = 200
#: Columns shown when a sink has no key columns.
FIRST_COLUMNS = 3


@dataclass(frozen=True)
class RowRef:
    """One row, as an error names it.

    ``columns`` are the identifying columns (the key, or the first columns when
    ``keyed`` is false); ``values`` their values as short text, or ``None`` when
    redacted (``digest`` is then a SHA-256 prefix of the values, so two errors about
    the same row can still be matched). ``partition`` is the Spark partition (or the
    sink's shard) and ``offset`` the row's position within it (0-based), each None
    when unknown.
    """

    columns: tuple[str, ...]
    values: tuple[str, ...] | None
    keyed: bool = True
    digest: str | None = None
    partition: int | None = None
    offset: int | None = None

    @classmethod
    def of(
        cls,
        batch: pa.RecordBatch,
        index: int,
        key_columns: Sequence[str] = (),
        *,
        partition: int | None = None,
        offset: int | None = None,
        redact: bool = False,
    ) -> RowRef:
        """Row ``index`` of ``batch``, named by ``key_columns`` (those present in the
        batch; none: its first :data:`FIRST_COLUMNS` columns). ``offset`` defaults to
        ``index`` (pass the rows written before this batch + ``index``)."""
        names = batch.schema.names
        keys = [c for c in key_columns if c in names]
        columns = tuple(keys or names[:FIRST_COLUMNS])
        raw = [batch.column(c)[index].as_py() for c in columns]
        return cls.from_values(
            columns,
            raw,
            keyed=bool(keys),
            partition=partition,
            offset=index if offset is None else offset,
            redact=redact,
        )

    @classmethod
    def from_values(
        cls,
        columns: Sequence[str],
        raw: Sequence[Any],
        *,
        keyed: bool = True,
        partition: int | None = None,
        offset: int | None = None,
        redact: bool = False,
    ) -> RowRef:
        """A row named by ``columns`` with the Python values ``raw``."""
        if redact:
            blob = json.dumps([_plain(v) for v in raw], default=str, sort_keys=True)
            digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
            return cls(tuple(columns), None, keyed, digest, partition, offset)
        return cls(tuple(columns), _texts(raw), keyed, None, partition, offset)

    def named(self) -> str:
        """The identifying part: ``key id=42``, ``id=42, name='bob'`` (first columns) or
        ``key id (values redacted, sha256 1a2b...)``."""
        lead = "key " if self.keyed else ""
        if not self.columns:
            return ""
        if self.values is None:
            return f"{lead}{', '.join(self.columns)} (values redacted, sha256 {self.digest})"
        return lead + _cut(
            ", ".join(f"{c}={v}" for c, v in zip(self.columns, self.values, strict=True))
        )

    def __str__(self) -> str:
        where = []
        if self.partition is not None:
            where.append(f"partition {self.partition}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        text = self.named()
        if not where:
            return text
        return f"{text} at {', '.join(where)}" if text else f"at {', '.join(where)}"


def _plain(value: Any) -> Any:
    return value.hex() if isinstance(value, (bytes, bytearray)) else value


def _texts(raw: Sequence[Any]) -> tuple[str, ...]:
    out = []
    for value in raw:
        if isinstance(value, (bytes, bytearray)):
            text = f"0x{bytes(value[:40]).hex()}" + ("…" if len(value) > 40 else "")
        else:
            text = repr(value)
        out.append(_cut(text, MAX_TEXT // 2))
    return tuple(out)


def _cut(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class RowNaming:
    """How one sink's transaction names its rows: its key columns, the partition (or
    shard) it writes, and whether values are redacted (the sink's ``redact_rows``)."""

    key_columns: tuple[str, ...] = ()
    partition: int | None = None
    redact: bool = False

    def ref(self, batch: pa.RecordBatch, index: int, offset: int | None = None) -> RowRef:
        """Row ``index`` of ``batch``, at ``offset`` of the partition (default ``index``)."""
        return RowRef.of(
            batch,
            index,
            self.key_columns,
            partition=self.partition,
            offset=offset,
            redact=self.redact,
        )

    def names(self) -> RowNames:
        """A :class:`RowNames` for a transaction that learns of bad rows only later."""
        return RowNames(self.key_columns, partition=self.partition, redact=self.redact)


class RowNames:
    """The identifying columns of every row a transaction sent, to name a row the target
    rejects only later by its offset (a COPY checked at its end).

    Keeps copies of ``key_columns`` (or the first columns) per batch, so nothing else of
    a batch stays in memory; past ``max_bytes`` it keeps nothing more, and rows beyond
    are named by their offset alone.
    """

    def __init__(
        self,
        key_columns: Sequence[str] = (),
        *,
        partition: int | None = None,
        redact: bool = False,
        max_bytes: int = 32 << 20,
    ) -> None:
        self.key_columns = tuple(key_columns)
        self.partition = partition
        self.redact = redact
        self.max_bytes = max_bytes
        self._kept: list[tuple[int, pa.RecordBatch]] = []  # (first offset, columns)
        self._rows = 0
        self._bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """``batch`` was sent, after every batch added before it."""
        import pyarrow as pa

        if self._bytes < self.max_bytes and batch.num_rows:
            names = batch.schema.names
            columns = [c for c in self.key_columns if c in names] or names[:FIRST_COLUMNS]
            # concat_arrays copies: a slice would keep the whole IPC message alive.
            arrays = [pa.concat_arrays([batch.column(c)]) for c in columns]
            kept = pa.RecordBatch.from_arrays(arrays, names=columns)
            self._kept.append((self._rows, kept))
            self._bytes += kept.nbytes
        self._rows += batch.num_rows

    def at(self, offset: int | None) -> RowRef | None:
        """The row at ``offset`` of the transaction (None: unknown offset)."""
        if offset is None:
            return None
        for first, kept in reversed(self._kept):
            if first <= offset < first + kept.num_rows:
                return RowRef.of(
                    kept,
                    offset - first,
                    self.key_columns,
                    partition=self.partition,
                    offset=offset,
                    redact=self.redact,
                )
        return RowRef((), None, False, None, self.partition, offset)
