"""Arrow record batches into ``COPY ... FROM STDIN``, inside one task's transaction.

Two paths, chosen once per transaction from the schema:

* CSV (every column flat and not binary): pyarrow's CSV writer renders the batch and
  the bytes go to ``COPY (FORMAT CSV)`` as they are. CSV quoting keeps NULL and the
  empty string apart; this is the fast path (hundreds of thousands of rows a second).
* rows (a nested or binary column): psycopg's ``write_row``, with maps, structs and
  lists of nested values as ``jsonb`` and flat lists as arrays.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pacsv

from txsink.connectors.postgres.types import csv_writable
from txsink.txid import TxnId

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = ["OpenTxn", "rows_for_copy", "start_copy"]


@dataclass
class OpenTxn:
    """One task's open transaction: its connection, in the two-phase transaction named
    ``txn``, with a COPY into ``target`` running; counts what went in."""

    txn: TxnId
    conn: psycopg.Connection[Any]
    copy_cm: Any
    copy: Any
    csv: bool
    columns: list[str]
    target: str  # the table the COPY feeds (the stage table in upsert mode)
    rows: int = 0
    nbytes: int = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Send ``batch`` to the COPY (PostgreSQL checks it as it arrives, or at the end)."""
        if self.csv:
            buf = io.BytesIO()
            pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
            data = buf.getvalue()
            self.copy.write(data)
            self.nbytes += len(data)
        else:
            for row in rows_for_copy(batch):
                self.copy.write_row(row)
            self.nbytes += batch.nbytes
        self.rows += batch.num_rows

    def end_copy(self) -> None:
        """Finish the COPY: the server has checked every row once this returns."""
        self.copy_cm.__exit__(None, None, None)


def start_copy(
    txn: TxnId, conn: psycopg.Connection[Any], target: sql.Identifier, schema: pa.Schema
) -> OpenTxn:
    """Open ``COPY target (columns of schema) FROM STDIN`` on ``conn``, in the path the
    schema allows."""
    from psycopg import sql

    columns = list(schema.names)
    csv = all(csv_writable(f.type) for f in schema)
    fmt = sql.SQL("(FORMAT CSV)") if csv else sql.SQL("")
    stmt = sql.SQL("COPY {} ({}) FROM STDIN {}").format(
        target, sql.SQL(", ").join(sql.Identifier(c) for c in columns), fmt
    )
    cm = conn.cursor().copy(stmt)
    copy = cm.__enter__()
    return OpenTxn(txn, conn, cm, copy, csv, columns, target.as_string(conn))


def rows_for_copy(batch: pa.RecordBatch) -> Iterator[tuple[Any, ...]]:
    """Rows for psycopg's ``write_row``: nested values become JSON or arrays."""
    from psycopg.types.json import Jsonb

    fields = list(batch.schema)
    columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]

    def convert(value: Any, t: pa.DataType) -> Any:
        if value is None:
            return None
        if pa.types.is_map(t):
            return Jsonb({str(k): v for k, v in value})
        if pa.types.is_struct(t):
            return Jsonb(value)
        if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_nested(t.value_type):
            return Jsonb(value)
        return value

    for i in range(batch.num_rows):
        yield tuple(convert(columns[c][i], fields[c].type) for c in range(len(fields)))
