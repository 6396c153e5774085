"""The Postgres sink's audit (``txsink audit``: :meth:`~txsink.contract.SinkContract.audit`,
what it answers is :mod:`txsink.audit.found`).

Everything is read in one ``REPEATABLE READ, READ ONLY`` transaction on a connection of
its own (one snapshot of the target and the progress table; nothing written; safe beside a
commit), each statement bounded by ``stall_timeout_s``:

metadata (the default)
    * the progress table's rows of the requested epochs (one query): each decided
      transaction has its row and its row count; a row of ours that no decision of the
      range names is an extra. This is txsink's own bookkeeping (written in the same
      transaction as the rows), not the rows themselves: said in ``how``;
    * with ``epoch_column`` (:mod:`~txsink.connectors.postgres.epochs`): ``SELECT col,
      count(*) ... WHERE col BETWEEN first AND last GROUP BY col`` (one query; an index on
      the column keeps it to the range): each epoch's count against the decision's rows,
      and rows tagged with an epoch that has no decided transaction of this sink as
      extras. Upsert: a key carries the epoch that last wrote it, so an epoch's count is
      at most its rows (checked), not equal to them.
deep (``deep=True``, needs ``epoch_column``, append mode)
    the epoch's rows, exactly the DataFrame's columns (the decision's digest names them;
    the epoch column is not one), read back through a server-side cursor and digested
    (:func:`~txsink.audit.digest.digest_rows`). Values come back as psycopg's Python
    values, brought to the Arrow types the epoch wrote (the decision records them; for an
    epoch decided before it did, the sink's start-up check if it ran), else as Arrow infers them;
    the digest's canonical form (every integer as int64, timestamps as UTC microseconds,
    decimals without trailing zeros) makes the two agree for the types ``create_table``
    makes. Types without a Python value pyarrow takes (``uuid``, ``inet``, ...) are read
    as text.

Without ``epoch_column`` the rows of an epoch cannot be told apart in the table: only the
progress table is read, and the notes say what that cannot see.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txsink.audit.digest import Digest, digest_batch
from txsink.audit.found import AuditRequest, EpochFound, EpochToAudit, Extra, TargetAudit
from txsink.connectors.postgres.casts import ColumnPlan, base_type
from txsink.connectors.postgres.checks import table_columns
from txsink.connectors.postgres.evolve import Evolving
from txsink.connectors.postgres.progress import KEEP_EPOCHS
from txsink.connectors.postgres.stall import Stall

if TYPE_CHECKING:
    import psycopg

    from txsink.connectors.postgres.tables import Tables

__all__ = ["Audited", "TargetReader"]

#: Rows per fetch of the deep read (and per digested Arrow batch).
FETCH_ROWS = 20_000
#: Column types whose psycopg values pyarrow takes as they come; others are read as text.
_NATIVE = {
    "boolean",
    "smallint",
    "integer",
    "bigint",
    "real",
    "double precision",
    "numeric",
    "text",
    "character varying",
    "character",
    "bpchar",
    "bytea",
    "date",
    "timestamp without time zone",
    "timestamp with time zone",
    "jsonb",
    "json",
}
_DOCS = "docs/connectors/postgres.md#audit"


class Audited(Evolving):
    """The sink's audit hook (a base class of
    :class:`~txsink.connectors.postgres.sink.PostgresSink`, which sets these attributes)."""

    uid: str
    progress: str
    epoch_column: str | None
    _plans: list[ColumnPlan] | None

    def audit(self, request: AuditRequest) -> TargetAudit:
        """What the table and the progress table hold for ``request``'s epochs (the module's
        docstring); read-only, on a connection of its own."""
        import psycopg

        conn = self._connect(autocommit=False, phase="audit")
        try:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            stall = self._stall(conn)
            with stall.guard("the audit"):
                current = conn.execute("SELECT current_schema()").fetchone()
            tables = self.tables.resolved(str(current[0]) if current else "public")
            sources = {p.name: p.source for p in self._plans or ()}
            reader = TargetReader(
                conn, stall, tables, self.uid, self.epoch_column, self.mode, sources
            )
            return reader.audit(request)
        except psycopg.Error as err:
            raise self._map(err, None, phase="audit") from err
        finally:
            conn.close()


@dataclass
class TargetReader:
    """One audit's reads of ``tables`` on ``conn`` (its transaction, its snapshot).

    ``sources``: the Arrow type each DataFrame column was written with, when known: from
    the epoch's decision (``EpochToAudit.schema``), else from the sink's check if it ran;
    the deep read brings the values back to them."""

    conn: psycopg.Connection[Any]
    stall: Stall
    tables: Tables
    uid: str
    epoch_column: str | None
    mode: str
    sources: Mapping[str, pa.DataType] = field(default_factory=dict)
    #: Epochs whose progress rows may have been pruned (older than KEEP_EPOCHS).
    pruned: list[int] = field(default_factory=list)

    def audit(self, request: AuditRequest) -> TargetAudit:
        out = TargetAudit()
        table = self.tables.qualified
        columns = self._query("the table's columns", lambda: table_columns(self.conn, self.tables))
        decided = [e for e in request.epochs if e.handles]
        if columns is None:
            for e in decided:
                out.epochs[e.epoch] = EpochFound(
                    rows=0, problems=[f"table {table} does not exist"], how=f"{table}'s catalog"
                )
            return out
        counts = self._epoch_counts(request, columns, out)
        self._progress(request, out)
        for e in decided:
            found = out.epochs.setdefault(e.epoch, EpochFound())
            if counts is not None:
                self._count(e, counts.get(e.epoch, 0), found)
                if request.deep and self.mode == "append":
                    found.digest = self._digest(e, columns, found)
            found.how = self._how(found.how, deep=request.deep and counts is not None)
        if counts is not None:
            audited = {e.epoch for e in decided}
            col = self.epoch_column
            out.extras += [
                Extra(
                    f"{n} row(s) of {table} with {col} = {epoch}, an epoch in which no "
                    "decision names a transaction of this sink",
                    epoch=epoch,
                    rows=n,
                )
                for epoch, n in sorted(counts.items())
                if epoch not in audited
            ]
        self._notes(request, counts is not None, out)
        return out

    # -- the table -------------------------------------------------------------------

    def _epoch_counts(
        self, request: AuditRequest, columns: dict[str, tuple[str, bool]], out: TargetAudit
    ) -> dict[int, int] | None:
        """Rows per epoch value in the requested range (None: no epoch column to count)."""
        col = self.epoch_column
        if col is None:
            return None
        if col not in columns:
            for e in request.epochs:
                if e.handles:
                    out.epochs[e.epoch] = EpochFound(
                        problems=[
                            f"table {self.tables.qualified} has no column {col!r} (the "
                            "sink's epoch_column): its rows cannot be counted per epoch"
                        ]
                    )
            return None
        from psycopg import sql

        stmt = sql.SQL(
            "SELECT {0}, count(*) FROM {1} WHERE {0} BETWEEN %s AND %s GROUP BY {0}"
        ).format(sql.Identifier(col), self.tables.ident())
        rows = self._query(
            "the rows per epoch",
            lambda: self.conn.execute(stmt, (request.first, request.last)).fetchall(),
        )
        return {int(epoch): int(n) for epoch, n in rows}

    def _count(self, epoch: EpochToAudit, n: int, found: EpochFound) -> None:
        if self.mode == "append":
            found.rows = n
            found.how = f"count(*) where {self.epoch_column} = {epoch.epoch}"
            return
        # Upsert: a key carries the epoch that last wrote it (later epochs take keys away).
        found.how = f"{n} key(s) last written by this epoch ({self.epoch_column})"
        if n > epoch.rows:
            found.problems.append(
                f"{n} rows of {self.tables.qualified} carry {self.epoch_column} = "
                f"{epoch.epoch}, more than the {epoch.rows} rows the epoch wrote"
            )

    def _digest(
        self, epoch: EpochToAudit, columns: dict[str, tuple[str, bool]], found: EpochFound
    ) -> Digest | None:
        """The digest of the epoch's rows, over the DataFrame's columns (the decision's)."""
        expected = epoch.expected
        if expected is not None:
            names = sorted(expected.cols)
        else:  # a decision from before the audit: the table's columns but ours
            names = [c for c in columns if c != self.epoch_column]
        missing = [c for c in names if c not in columns]
        if missing:
            found.problems.append(
                f"column(s) {', '.join(missing)} of the epoch's rows are not in "
                f"{self.tables.qualified} any more: the rows cannot be read back whole"
            )
            return None
        types = {c: base_type(columns[c][0]) for c in names}
        if epoch.schema is not None:  # the decision's record of the types the tasks had
            self.sources = {f.name: f.type for f in epoch.schema}
        digest = Digest.total(digest_batch(b) for b in self._read(epoch.epoch, names, types))
        return digest if digest.rows else Digest(cols={c: 0 for c in names})

    def _read(
        self, epoch: int, names: Sequence[str], types: Mapping[str, str]
    ) -> Iterator[pa.Table]:
        """The epoch's rows of ``names``, :data:`FETCH_ROWS` at a time, as Arrow."""
        from psycopg import sql

        selected = [
            sql.Identifier(c)
            if self._native(c, types[c])
            else sql.SQL("{}::text").format(sql.Identifier(c))
            for c in names
        ]
        stmt = sql.SQL("SELECT {} FROM {} WHERE {} = %s").format(
            sql.SQL(", ").join(selected),
            self.tables.ident(),
            sql.Identifier(self.epoch_column or ""),
        )
        with self.conn.cursor(name=f"txsink_audit_{epoch}") as cur:
            self._query("the epoch's rows", lambda: cur.execute(stmt, (epoch,)))
            while True:
                rows = self._query("the epoch's rows", lambda: cur.fetchmany(FETCH_ROWS))
                if not rows:
                    return
                yield pa.table(
                    {c: self._arrow(c, [r[i] for r in rows]) for i, c in enumerate(names)}
                )

    def _native(self, name: str, pg_type: str) -> bool:
        """Whether the column is read as psycopg's value (else as text): JSON that was
        written from text (not from a struct or list) is read as that text."""
        source = self.sources.get(name)
        if pg_type in ("json", "jsonb"):
            return source is None or pa.types.is_nested(source)
        return pg_type in _NATIVE or pg_type.endswith("[]")

    def _arrow(self, name: str, values: list[Any]) -> pa.Array:
        """``values`` as Arrow: inferred, then cast to the type the epoch wrote if known."""
        source = self.sources.get(name)
        if source is not None and pa.types.is_nested(source):
            try:  # JSON back into the struct or list it was written from
                return pa.array(values, type=source)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                pass
        arr = pa.array(values)
        if source is None or arr.type == source or pa.types.is_null(arr.type):
            return arr
        try:
            return arr.cast(source)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            return arr  # the digest's canonical form may still agree

    # -- the progress table ----------------------------------------------------------

    def _progress(self, request: AuditRequest, out: TargetAudit) -> None:
        """Each decided transaction's progress row and count; ours that no decision names."""
        from psycopg import sql

        progress = self.tables.progress_ident
        exists = self._query(
            "the progress table",
            lambda: self.conn.execute(
                "SELECT to_regclass(%s)", (self.tables.regclass(self.tables.progress),)
            ).fetchone(),
        )
        name = f"{self.tables.schema}.{self.tables.progress}"
        decided = [e for e in request.epochs if e.handles]
        if exists is None or exists[0] is None:
            for e in decided:
                out.epochs.setdefault(e.epoch, EpochFound()).problems.append(
                    f"the progress table {name} does not exist"
                )
            return
        uid = self.uid
        stmt = sql.SQL(
            "SELECT epoch, gid, rows FROM {0} WHERE app_id = %s AND uid = %s "
            "AND epoch BETWEEN %s AND %s UNION ALL "
            "SELECT NULL, NULL, max(epoch) FROM {0} WHERE app_id = %s AND uid = %s"
        ).format(progress)
        args = (request.app_id, uid, request.first, request.last, request.app_id, uid)
        rows = self._query("the progress table", lambda: self.conn.execute(stmt, args).fetchall())
        recorded: dict[str, tuple[int, int]] = {}
        newest = None
        for epoch, gid, n in rows:
            if gid is None:
                newest = None if n is None else int(n)
            else:
                recorded[str(gid)] = (int(epoch), int(n))
        named: set[str] = set()
        for e in decided:
            found = out.epochs.setdefault(e.epoch, EpochFound())
            pruned = newest is not None and e.epoch < newest - KEEP_EPOCHS
            if pruned:
                self.pruned.append(e.epoch)
            for handle in e.handles:
                gid = str(handle.txn)
                named.add(gid)
                if gid not in recorded:
                    if not pruned:
                        found.problems.append(
                            f"transaction {gid} has no row in the progress table {name} "
                            "(txsink's record of its commit)"
                        )
                elif recorded[gid][1] != handle.rows:
                    found.problems.append(
                        f"the progress table {name} records {recorded[gid][1]} rows for "
                        f"transaction {gid}, the decision {handle.rows}"
                    )
        out.extras += [
            Extra(
                f"transaction {gid} committed {n} rows (its row in the progress table "
                f"{name}), and no decision names it",
                epoch=epoch,
                rows=n,
            )
            for gid, (epoch, n) in sorted(recorded.items())
            if gid not in named
        ]

    # -- what to say -----------------------------------------------------------------

    def _how(self, how: str, *, deep: bool) -> str:
        parts = [how] if how else []
        if deep and self.mode == "append":
            parts.append("the epoch's rows read back and digested")
        parts.append(f"the progress table {self.tables.progress} (txsink's own record)")
        return "; ".join(parts)

    def _notes(self, request: AuditRequest, counted: bool, out: TargetAudit) -> None:
        table = self.tables.qualified
        if not counted:
            out.notes.append(
                f"no epoch_column: the rows of an epoch cannot be told apart in {table}, so "
                "only txsink's progress table was read: rows deleted, changed or added by "
                "hand, a TRUNCATE, or a restore of the table alone are not seen; set "
                f"epoch_column= ({_DOCS})"
            )
            if request.deep:
                out.notes.append("deep: not read (it needs epoch_column)")
        elif self.mode == "upsert":
            out.notes.append(
                f"upsert: a key of {table} carries the epoch that last wrote it, so an "
                "epoch's count is checked to be at most its rows, not equal; rows are not "
                "compared one by one"
                + (", and deep reads no rows (later epochs overwrite them)" if request.deep else "")
            )
        else:
            out.notes.append(
                f"rows of {table} whose {self.epoch_column} is NULL (written before the "
                "column, or by another writer) or outside the audited epochs are not read"
            )
        if self.pruned:
            out.notes.append(
                f"progress rows more than {KEEP_EPOCHS} epochs old are pruned: epochs "
                f"{self.pruned[0]}-{self.pruned[-1]} were not checked against them"
            )

    def _query(self, what: str, run: Any) -> Any:
        with self.stall.guard(f"the audit ({what})"):
            return run()
