"""Arrow record batches into ``COPY ... FROM STDIN (FORMAT BINARY)``, inside one task's
transaction.

Every column type goes this one path: each batch is cast in Arrow to the table's
column types and encoded by ``pgpq`` (:mod:`~txsink.connectors.postgres.binary`), and
the bytes go to the COPY as they are. Every wait on the server (each write, the end of
the COPY) is bounded by the connection's :class:`~txsink.connectors.postgres.stall.Stall`
guard, so a stalled server ends the task instead of hanging it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from txsink.connectors.postgres.binary import BinaryEncoder
from txsink.connectors.postgres.casts import ColumnPlan
from txsink.connectors.postgres.epochs import EPOCH
from txsink.connectors.postgres.stall import Stall
from txsink.rowref import RowNames
from txsink.txid import TxnId

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = ["OpenTxn", "start_copy"]


@dataclass
class OpenTxn:
    """One task's open transaction: its connection, in the two-phase transaction named
    ``txn``, with a binary COPY into ``target`` running; counts what went in."""

    txn: TxnId
    conn: psycopg.Connection[Any]
    stall: Stall
    copy_cm: Any
    copy: Any
    encoder: BinaryEncoder
    columns: list[str]
    target: str  # the table the COPY feeds (the stage table in upsert mode)
    rows: int = 0
    nbytes: int = 0
    #: The identifying columns of the rows sent: the server names a bad row by its line.
    names: RowNames | None = None
    #: The epoch column, filled with ``txn.epoch`` in every row (``epoch_column``).
    stamp: str | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        """Send ``batch`` to the COPY (PostgreSQL checks it as it arrives, or at the end)."""
        if self.names is not None:
            self.names.add(batch)
        if self.stamp is not None:
            epochs = pa.array(np.full(batch.num_rows, self.txn.epoch, dtype=np.int64))
            batch = pa.RecordBatch.from_arrays(
                [*batch.columns, epochs], names=[*batch.schema.names, self.stamp]
            )
        data = self.encoder.encode(batch, self.rows)
        with self.stall.guard("COPY"):
            self.copy.write(data)
        self.nbytes += len(data)
        self.rows += batch.num_rows

    def end_copy(self) -> None:
        """Finish the COPY: the server has checked every row once this returns."""
        rest = self.encoder.finish()  # pgpq holds small outputs back until a chunk is full
        with self.stall.guard("COPY"):
            self.copy.write(rest)
            self.copy_cm.__exit__(None, None, None)
        self.nbytes += len(rest)


def start_copy(
    txn: TxnId,
    conn: psycopg.Connection[Any],
    stall: Stall,
    target: sql.Identifier,
    plans: Sequence[ColumnPlan],
    *,
    names: RowNames | None = None,
) -> OpenTxn:
    """Open ``COPY target (the planned columns) FROM STDIN (FORMAT BINARY)`` on ``conn``
    (``names`` keeps what names a row the server rejects; a plan of ``how`` ``"epoch"`` is
    the epoch column, filled by :meth:`OpenTxn.write`)."""
    from psycopg import sql

    columns = [p.name for p in plans]
    stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        target, sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )
    encoder = BinaryEncoder(plans)
    with stall.guard("COPY"):
        cm = conn.cursor().copy(stmt)
        copy = cm.__enter__()
        copy.write(encoder.header())
    stamp = next((p.name for p in plans if p.how == EPOCH), None)
    target_name = target.as_string(conn)
    return OpenTxn(
        txn, conn, stall, cm, copy, encoder, columns, target_name, names=names, stamp=stamp
    )
