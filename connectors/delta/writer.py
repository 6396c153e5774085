"""A task's open transaction: Parquet files per partition, and their ``add`` statistics.

Rows are conformed to the table's schema (column order, types; a null in a non-nullable
column is refused with its row and column), split by the table's partition columns (Spark's
Hive layout: the partition columns are not in the files), and written to one file per
partition value under the transaction's name. Statistics are exact, for the columns whose
Delta form is unambiguous (integers, dates, short strings): readers skip files by them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from txsink.connectors.delta import naming
from txsink.connectors.delta.handles import DeltaFile
from txsink.connectors.delta.storage import Storage
from txsink.txid import TxnId

__all__ = ["OpenFile", "OpenTxn", "conform", "groups"]

#: A row group holds up to this many rows, or this many bytes of Arrow data: Spark hands
#: batches of 10,000 rows, and a row group per batch made files ~27% larger and slower to
#: encode than one row group per million rows (what write_deltalake writes).
ROW_GROUP_ROWS = 1 << 20
ROW_GROUP_BYTES = 64 << 20
#: Strings longer than this get no min/max (Delta engines truncate theirs at 32 chars).
_MAX_STAT_CHARS = 32
Group = tuple[str | None, ...]


@dataclass
class _ColumnStats:
    nulls: int = 0
    low: Any = None
    high: Any = None
    exact: bool = True  # False once a value cannot be a statistic (too long)

    def add(self, column: pa.Array | pa.ChunkedArray) -> None:
        self.nulls += column.null_count
        typ = column.type
        if not self.exact or not (
            pa.types.is_integer(typ) or pa.types.is_date32(typ) or pa.types.is_string(typ)
        ):
            self.exact = False
            return
        if len(column) == column.null_count:
            return
        if pa.types.is_string(typ) and pc.max(pc.utf8_length(column)).as_py() > _MAX_STAT_CHARS:
            self.exact = False
            return
        found = pc.min_max(column).as_py()
        low, high = found["min"], found["max"]
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)


@dataclass
class OpenFile:
    """One file of the transaction, being written."""

    path: str
    values: Group
    stream: Any
    writer: pq.ParquetWriter
    rows: int = 0
    stats: dict[str, _ColumnStats] = field(default_factory=dict)
    pending: list[pa.RecordBatch] = field(default_factory=list)
    pending_rows: int = 0
    pending_bytes: int = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Buffer ``batch`` into the current row group (written once it is full)."""
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        self.pending_bytes += batch.nbytes
        self.rows += batch.num_rows
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            self.stats.setdefault(name, _ColumnStats()).add(column)
        if self.pending_rows >= ROW_GROUP_ROWS or self.pending_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the buffered batches as one row group."""
        if self.pending:
            table = pa.Table.from_batches(self.pending)
            self.writer.write_table(table, row_group_size=max(1, self.pending_rows))
            self.pending, self.pending_rows, self.pending_bytes = [], 0, 0

    def stats_json(self) -> str:
        doc: dict[str, Any] = {"numRecords": self.rows, "nullCount": {}}
        low: dict[str, Any] = {}
        high: dict[str, Any] = {}
        for name, st in self.stats.items():
            doc["nullCount"][name] = st.nulls
            if st.exact and st.low is not None:
                low[name] = str(st.low) if not isinstance(st.low, int) else st.low
                high[name] = str(st.high) if not isinstance(st.high, int) else st.high
        doc["minValues"], doc["maxValues"] = low, high
        return json.dumps(doc, separators=(",", ":"))


@dataclass
class OpenTxn:
    """A task's transaction: where it writes and what it holds open."""

    txn: TxnId
    storage: Storage
    table_schema: pa.Schema  # every column, the table's order and types
    partition_by: tuple[str, ...]
    compression: str
    open: dict[Group, OpenFile] = field(default_factory=dict)
    done: list[DeltaFile] = field(default_factory=list)
    rows: int = 0
    seq: int = 0

    @property
    def file_schema(self) -> pa.Schema:
        return pa.schema([f for f in self.table_schema if f.name not in self.partition_by])

    def file_for(self, values: Group) -> OpenFile:
        found = self.open.get(values)
        if found is None:
            path = naming.file_path(self.txn, self.seq, self.partition_by, values)
            self.seq += 1
            stream = self.storage.open_output(path)
            writer = pq.ParquetWriter(stream, self.file_schema, compression=self.compression)
            found = self.open[values] = OpenFile(path, values, stream, writer)
        return found

    def finish(self, values: Group) -> None:
        """Close one file, make it durable, and keep its ``add`` description."""
        f = self.open.pop(values)
        f.flush()
        f.writer.close()
        f.stream.close()
        self.storage.sync(f.path)
        size = self.storage.size(f.path)
        self.done.append(
            DeltaFile(
                path=f.path,
                size=int(size or 0),
                rows=f.rows,
                partition=tuple(zip(self.partition_by, values, strict=True)),
                stats=f.stats_json(),
                modified_ms=int(time.time() * 1000),
            )
        )

    def close_all(self) -> None:
        """Best effort, for a discarded transaction: close what is open, keep nothing."""
        for f in self.open.values():
            for closing in (f.writer.close, f.stream.close):
                # Discarding: the files are deleted next, whatever closing them did.
                with contextlib.suppress(Exception):
                    closing()


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with the table's columns, order and types (checked compatible at start)."""
    columns = [batch.column(f.name).cast(f.type) for f in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def first_null(batch: pa.RecordBatch, schema: pa.Schema) -> tuple[int, str] | None:
    """(row, column) of the first null in a column the table declares non-nullable."""
    for f in schema:
        if f.nullable or f.name not in batch.schema.names:
            continue
        column = batch.column(f.name)
        if column.null_count:
            row = pc.index(pc.is_null(column), True).as_py()
            return int(row), f.name
    return None


def groups(
    batch: pa.RecordBatch, partition_by: tuple[str, ...]
) -> Iterator[tuple[Group, pa.RecordBatch]]:
    """(partition values, rows without the partition columns) of a conformed batch."""
    if not partition_by:
        yield (), batch
        return
    values = zip(
        *([naming.partition_value(v) for v in batch.column(c).to_pylist()] for c in partition_by),
        strict=True,
    )
    rows: dict[Group, list[int]] = {}
    for i, group in enumerate(values):
        rows.setdefault(group, []).append(i)
    data = batch.drop_columns(list(partition_by))
    for group, indices in rows.items():
        yield group, data.take(pa.array(indices, pa.int64()))
