"""The Postgres sink's staging commit, on a server as PostgreSQL ships it
(``max_prepared_transactions = 0``, the ``postgres_stock`` service).

Every check reads the server back with psycopg queries of its own (the target, the staging
tables by name pattern, ``pg_prepared_xacts``), never through the sink. The generic contract
(``integration/test_contract.py``, variant ``staging``) and the crash matrices
(``test_matrix.py``) run the staging commit too; here are what only it has: the choice of
``commit="auto"``, the refusals before the decision (a bad row at the COPY; a constraint
that only the move could meet, at the check), upsert's move, a least-privileged role, and a
commit that finds its staged rows gone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.postgres import PostgresSink
from txsink.connectors.postgres.testing import staged_names
from txsink.errors import CommitError, ConfigurationError, WriteError
from txsink.handles import Handle
from txsink.testing.contract import SCHEMA, commit, rows
from txsink.txid import TxnId

pytestmark = pytest.mark.postgres_stock

COLUMNS = "id bigint, key text, amount double precision, payload text"
APP = "stg"


def _table(server: Any, ddl: str = COLUMNS, extra: Sequence[str] = ()) -> str:
    schema = server.new_schema()
    with server.connect() as conn:
        conn.execute(f"CREATE TABLE {schema}.events ({ddl})")
        for statement in extra:
            conn.execute(statement.format(t=f"{schema}.events", s=schema))
    return f"{schema}.events"


def _sink(server: Any, table: str, **options: Any) -> PostgresSink:
    return PostgresSink(server.dsn, table, uid="stg", stall_timeout_s=8, **options)


def _prepare(sink: PostgresSink, epoch: int, parts: Sequence[Sequence[int]]) -> list[Handle]:
    handles = []
    for p, ids in enumerate(parts):
        txn = TxnId(APP, sink.uid, epoch, 0, p, 100 + p)
        open_ = sink.begin(txn, SCHEMA)
        sink.write(open_, rows(ids))
        handles.append(sink.prepare(open_))
    return handles


def _ids(server: Any, table: str) -> list[int]:
    with server.connect() as conn:
        return sorted(int(r[0]) for r in conn.execute(f"SELECT id FROM {table}").fetchall())


def _leftovers(server: Any, table: str) -> list[str]:
    with server.connect() as conn:
        staged = staged_names(conn, table, "txsink.")
        prepared = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (f"txsink.{APP}.",)
        ).fetchall()
    return staged + [str(r[0]) for r in prepared]


def test_auto_chooses_staging_on_a_stock_server_and_says_so(
    postgres_stock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    table = _table(postgres_stock)
    sink = _sink(postgres_stock, table)
    with caplog.at_level(logging.INFO, logger="txsink.connectors.postgres.sink"):
        sink.check(SCHEMA, APP)
    assert sink.protocol == "staging"
    said = [r.getMessage() for r in caplog.records if "commits with" in r.getMessage()]
    assert said == [
        f"[uid=stg epoch=None] {table} commits with a staging table: the server has "
        "max_prepared_transactions = 0"
    ], said
    handles = _prepare(sink, 0, [[1, 2, 3], [4, 5]])
    assert _ids(postgres_stock, table) == []  # staged, not visible
    assert len(_leftovers(postgres_stock, table)) == 2
    commit(sink, 0, handles)
    assert _ids(postgres_stock, table) == [1, 2, 3, 4, 5]
    assert _leftovers(postgres_stock, table) == []
    assert sink.recorded_epoch(APP) == 0


def test_auto_keeps_two_phase_commit_where_the_server_allows_it(postgres: Any) -> None:
    table = _table(postgres)
    sink = _sink(postgres, table)
    sink.check(SCHEMA, APP)
    assert sink.protocol == "2pc"


def test_forced_two_phase_commit_on_a_stock_server_names_both_fixes(postgres_stock: Any) -> None:
    sink = _sink(postgres_stock, _table(postgres_stock), commit="2pc")
    with pytest.raises(ConfigurationError) as info:
        sink.check(SCHEMA, APP)
    text = str(info.value)
    assert "max_prepared_transactions = 0" in text and "commit='staging'" in text, text


def test_a_bad_row_fails_its_task_before_the_vote(postgres_stock: Any) -> None:
    """NOT NULL and CHECK are the staging table's too: the COPY refuses the row, naming it
    and the column, and the task's transaction leaves nothing staged."""
    ddl = "id bigint, key text NOT NULL, amount double precision CHECK (amount < 0.5), payload text"
    table = _table(postgres_stock, ddl)
    sink = _sink(postgres_stock, table, redact_rows=False)
    sink.check(pa.schema([f.with_nullable(False) for f in SCHEMA]), APP)
    txn = TxnId(APP, sink.uid, 0, 0, 3, 7)
    open_ = sink.begin(txn, SCHEMA)
    with pytest.raises(WriteError) as info:
        sink.write(open_, rows(range(40, 60)))  # amount = id / 100: 0.50 from id 50
        sink.prepare(open_)
    sink.discard(open_)
    err = info.value
    assert (err.epoch, err.partition) == (0, 3) and err.phase in ("write", "prepare"), err
    assert "50" in str(err.row), err.row  # the first offending row, by its values
    assert "amount" in str(err), err
    assert _ids(postgres_stock, table) == [] and _leftovers(postgres_stock, table) == []


@pytest.mark.parametrize(
    ("mode", "extra", "refused"),
    [
        ("append", ["CREATE UNIQUE INDEX ON {t} (id)"], "unique index"),
        ("append", ["ALTER TABLE {t} ADD PRIMARY KEY (id)"], "unique index"),
        (
            "append",
            [
                "CREATE TABLE {s}.parent (k text PRIMARY KEY)",
                "ALTER TABLE {t} ADD FOREIGN KEY (key) REFERENCES {s}.parent (k)",
            ],
            "foreign key",
        ),
        (
            "upsert",
            ["ALTER TABLE {t} ADD PRIMARY KEY (id)", "CREATE UNIQUE INDEX ON {t} (payload)"],
            "unique index",
        ),
        (
            "upsert",
            [
                "ALTER TABLE {t} ADD PRIMARY KEY (id)",
                "ALTER TABLE {t} ADD COLUMN cap float8",
                "ALTER TABLE {t} ADD CHECK (amount <= coalesce(cap, 1e9))",
            ],
            "CHECK constraint",
        ),
    ],
    ids=[
        "append-unique",
        "append-primary-key",
        "foreign-key",
        "upsert-other-unique",
        "upsert-check",
    ],
)
def test_what_only_the_move_could_refuse_is_refused_at_the_check(
    postgres_stock: Any, mode: str, extra: list[str], refused: str
) -> None:
    table = _table(postgres_stock, extra=extra)
    key = ["id"] if mode == "upsert" else []
    sink = _sink(postgres_stock, table, mode=mode, key=key)
    with pytest.raises(ConfigurationError) as info:
        sink.check(SCHEMA, APP)
    text = str(info.value)
    assert refused in text and "commit='2pc'" in text, text
    assert info.value.phase == "check"


def test_upsert_moves_the_last_row_of_each_key(postgres_stock: Any) -> None:
    table = _table(postgres_stock, extra=["ALTER TABLE {t} ADD PRIMARY KEY (id)"])
    sink = _sink(postgres_stock, table, mode="upsert", key=["id"])
    sink.check(SCHEMA, APP)
    commit(sink, 0, _prepare(sink, 0, [[1, 2], [3]]))
    txn = TxnId(APP, sink.uid, 1, 0, 0, 9)
    open_ = sink.begin(txn, SCHEMA)
    batch = rows([2, 2, 4])
    newer = batch.set_column(3, "payload", pa.array(["old", "new", "four"]))
    sink.write(open_, newer)
    handle = sink.prepare(open_)
    commit(sink, 1, [handle])
    commit(_sink(postgres_stock, table, mode="upsert", key=["id"]), 1, [handle])  # again
    with postgres_stock.connect() as conn:
        got = dict(conn.execute(f"SELECT id, payload FROM {table}").fetchall())
    assert got == {1: "event-000000001", 2: "new", 3: "event-000000003", 4: "four"}, got
    assert _leftovers(postgres_stock, table) == []


def test_a_commit_that_finds_its_staged_rows_gone_is_refused_whole(postgres_stock: Any) -> None:
    """Outcome 3: the transaction rolls back, nothing of the epoch is visible, the
    CommitError names the transaction; the other handle's rows stay staged."""
    table = _table(postgres_stock)
    sink = _sink(postgres_stock, table)
    sink.check(SCHEMA, APP)
    handles = _prepare(sink, 0, [[1, 2], [3, 4]])
    with postgres_stock.connect() as conn:
        (staging,) = conn.execute(
            "SELECT relname FROM pg_class WHERE relname LIKE 'txsink\\_staging\\_%%' "
            "AND relnamespace = %s::regnamespace",
            (table.split(".")[0],),
        ).fetchone() or ("",)
        conn.execute(
            f'DELETE FROM {table.split(".")[0]}."{staging}" WHERE __txsink_gid = %s AND id = 4',
            (str(handles[1].txn),),
        )
    with pytest.raises(CommitError) as info:
        commit(sink, 0, handles)
    assert info.value.partition == 1 and "holds 1 of its 2 rows" in str(info.value)
    assert _ids(postgres_stock, table) == []
    assert sink.recorded_epoch(APP) is None


def test_a_least_privileged_role_uses_a_staging_schema_made_for_it(postgres_stock: Any) -> None:
    """Without CREATE on the target's schema the check names the grant; with a staging
    schema it may create in, the sink works."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    admin_pw = Path(__file__).with_name(".work") / "postgres_stock" / "admin-password"
    if not admin_pw.exists():
        pytest.skip("needs the harness's own server (superuser password) to create a role")
    table = _table(postgres_stock)
    schema = table.split(".")[0]
    role = f"lp_{schema}"[:60]
    staging_schema = postgres_stock.new_schema("stg")
    params = conninfo_to_dict(postgres_stock.dsn)
    admin = make_conninfo("", **{**params, "user": "postgres", "password": admin_pw.read_text()})
    with postgres_stock.connect(dsn=admin) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'lp'")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT, INSERT ON {table} TO {role}")
        # The progress table, created beforehand by the owner (the role cannot create it).
        conn.execute(
            f"CREATE TABLE {schema}.txsink_progress (app_id text NOT NULL, uid text NOT NULL, "
            "gid text PRIMARY KEY, epoch bigint NOT NULL, partition integer NOT NULL, "
            "rows bigint NOT NULL, prepared_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute(f"GRANT SELECT, INSERT, DELETE ON {schema}.txsink_progress TO {role}")
    dsn = make_conninfo("", **{**params, "user": role, "password": "lp"})
    try:
        with pytest.raises(ConfigurationError) as info:
            PostgresSink(dsn, table, uid="stg").check(SCHEMA, APP)
        assert f'GRANT CREATE ON SCHEMA "{schema}" TO "{role}";' in str(info.value)
        with postgres_stock.connect(dsn=admin) as conn:
            conn.execute(f"GRANT USAGE, CREATE ON SCHEMA {staging_schema} TO {role}")
        sink = PostgresSink(dsn, table, uid="stg", staging_schema=staging_schema)
        sink.check(SCHEMA, APP)
        commit(sink, 0, _prepare(sink, 0, [[1], [2, 3]]))
        sink.release()
        assert _ids(postgres_stock, table) == [1, 2, 3]
    finally:
        with postgres_stock.connect(dsn=admin) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {staging_schema} CASCADE")
            conn.execute(f"DROP OWNED BY {role} CASCADE")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def _staging_file(server: Any, table: str) -> tuple[str, int]:
    """The sink's staging table (found by name pattern) and its relfilenode, which TRUNCATE
    changes and DELETE does not."""
    with server.connect() as conn:
        row = conn.execute(
            "SELECT c.oid::regclass::text, c.relfilenode FROM pg_class c "
            "WHERE c.relname LIKE 'txsink\\_staging\\_%%' AND c.relnamespace = %s::regnamespace",
            (table.split(".", maxsplit=1)[0],),
        ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def test_the_move_empties_staging_by_truncate_when_alone_else_by_delete(
    postgres_stock: Any,
) -> None:
    """Three ways to remove the moved rows, one result: TRUNCATE (staging holds only the
    epoch, nobody else holds a lock on it); DELETE of the decided names when a leftover
    attempt's rows are staged beside them (they stay, for recovery's abort); DELETE feeding
    the INSERT when another session holds a lock on staging (a task still writing)."""
    table = _table(postgres_stock)
    sink = _sink(postgres_stock, table)
    sink.check(SCHEMA, APP)
    staging, before = _staging_file(postgres_stock, table)
    commit(sink, 0, _prepare(sink, 0, [[1, 2], [3]]))
    assert _staging_file(postgres_stock, table)[1] != before, "alone: TRUNCATE"

    decided = _prepare(sink, 1, [[4, 5], [6]])
    leftover = TxnId(APP, sink.uid, 1, 0, 0, 999)  # a retried attempt's twin
    open_ = sink.begin(leftover, SCHEMA)
    sink.write(open_, rows([4, 5]))
    sink.prepare(open_)
    before = _staging_file(postgres_stock, table)[1]
    commit(sink, 1, decided)
    assert _staging_file(postgres_stock, table)[1] == before, "not alone: DELETE"
    listed = [str(h.txn) for h in sink.list_prepared(APP)]
    assert listed == [str(leftover)], listed
    for handle in sink.list_prepared(APP):
        sink.abort(handle)

    reader = postgres_stock.connect(autocommit=False)
    try:
        reader.execute(f"SELECT count(*) FROM {staging}").fetchone()  # holds ACCESS SHARE
        commit(sink, 2, _prepare(sink, 2, [[7], [8, 9]]))
        assert _staging_file(postgres_stock, table)[1] == before, "locked: DELETE ... RETURNING"
    finally:
        reader.close()
    assert _ids(postgres_stock, table) == list(range(1, 10))
    assert _leftovers(postgres_stock, table) == []


def test_rename_uid_drops_the_old_uids_empty_staging_table(postgres_stock: Any) -> None:
    table = _table(postgres_stock)
    old = PostgresSink(postgres_stock.dsn, table, uid="old", stall_timeout_s=8)
    old.check(SCHEMA, APP)
    commit(old, 0, _prepare(old, 0, [[1, 2]]))
    old_staging, _ = _staging_file(postgres_stock, table)
    new = PostgresSink(postgres_stock.dsn, table, uid="new", stall_timeout_s=8)
    said = new.migrate_uid("old", app_id=APP, dry_run=True)
    assert any(f"would drop the staging table {old_staging}" in line for line in said), said
    said = new.migrate_uid("old", app_id=APP)
    assert any(f"dropped the staging table {old_staging}" in line for line in said), said
    with postgres_stock.connect() as conn:
        gone = conn.execute("SELECT to_regclass(%s)", (old_staging,)).fetchone()
    assert gone == (None,)
    new.check(SCHEMA, APP)  # makes the new uid's staging table
    assert new.recorded_epoch(APP) == 0
    commit(new, 1, _prepare(new, 1, [[3]]))
    assert _ids(postgres_stock, table) == [1, 2, 3]


def test_a_changed_table_remakes_an_empty_staging_table_and_refuses_a_full_one(
    postgres_stock: Any,
) -> None:
    table = _table(postgres_stock)
    sink = _sink(postgres_stock, table)
    sink.check(SCHEMA, APP)
    staging, _ = _staging_file(postgres_stock, table)
    with postgres_stock.connect() as conn:
        conn.execute(f"ALTER TABLE {table} ADD CHECK (amount >= 0)")
    sink.check(SCHEMA, APP)  # empty: made again, with the new constraint
    with postgres_stock.connect() as conn:
        checks = conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'",
            (staging,),
        ).fetchone()
    assert checks == (1,)
    _prepare(sink, 0, [[1, 2]])  # staged, undecided (a crash before the decision)
    with postgres_stock.connect() as conn:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN note text")
    with pytest.raises(ConfigurationError, match="holds 2 rows staged before the table's"):
        _sink(postgres_stock, table).check(SCHEMA, APP)
    with postgres_stock.connect() as conn:
        conn.execute(f"ALTER TABLE {table} DROP COLUMN note")
    again = _sink(postgres_stock, table)
    again.check(SCHEMA, APP)  # the definition it was made from: the rows can be recovered
    for handle in again.list_prepared(APP):
        again.abort(handle)
    assert _leftovers(postgres_stock, table) == []


def test_two_drivers_committing_one_epoch_at_once_commit_it_once(postgres_stock: Any) -> None:
    """A zombie driver and its successor: the advisory lock serializes them, and the second
    finds the progress rows of the first (outcome 2), whichever comes first."""
    from concurrent.futures import ThreadPoolExecutor

    from txsink.handles import dump_handle, load_handle

    table = _table(postgres_stock)
    sink = _sink(postgres_stock, table)
    sink.check(SCHEMA, APP)
    docs = [dump_handle(h) for h in _prepare(sink, 0, [list(range(0, 3000)), [5000]])]
    drivers = [_sink(postgres_stock, table) for _ in range(2)]
    for driver in drivers:
        driver.check(SCHEMA, APP)
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda d: commit(d, 0, [load_handle(doc) for doc in docs]), drivers))
    for driver in (sink, *drivers):
        driver.release()
    assert all(units for units in done)
    assert _ids(postgres_stock, table) == [*range(0, 3000), 5000]
    assert _leftovers(postgres_stock, table) == []


def test_one_epoch_may_hold_prepared_and_staged_handles(postgres: Any) -> None:
    """``auto`` may choose differently after a server change: a decided epoch with both
    kinds (one task before, one after) commits each the way it was made."""
    table = _table(postgres)
    two_phase = _sink(postgres, table, commit="2pc")
    staged = _sink(postgres, table, commit="staging")
    two_phase.check(SCHEMA, APP)
    staged.check(SCHEMA, APP)
    txn = TxnId(APP, "stg", 0, 0, 0, 1)
    open_ = two_phase.begin(txn, SCHEMA)
    two_phase.write(open_, rows([1, 2]))
    handles = [two_phase.prepare(open_)]
    txn = TxnId(APP, "stg", 0, 0, 1, 2)
    open_ = staged.begin(txn, SCHEMA)
    staged.write(open_, rows([3]))
    handles.append(staged.prepare(open_))
    assert {type(h).__name__ for h in staged.list_prepared(APP)} == {"PgHandle", "StagedHandle"}
    commit(staged, 0, handles)
    commit(two_phase, 0, handles)  # again, by the other: nothing more
    for sink in (two_phase, staged):
        sink.release()
    assert _ids(postgres, table) == [1, 2, 3]
    assert _leftovers(postgres, table) == []


@pytest.mark.postgres  # the harness installs Debian's PostgreSQL binaries
def test_a_server_crash_between_decision_and_commit_keeps_the_staged_epoch() -> None:
    """The server SIGKILLed after the tasks' pre-commits (the epoch decided, nothing moved)
    and started again: its crash recovery keeps the staged rows (a logged table; an
    UNLOGGED one would come back empty), and a new driver commits the handles once."""
    import psycopg
    from crashable_targets import CrashablePostgres

    from txsink.handles import dump_handle, load_handle

    server = CrashablePostgres.create(max_prepared=0)
    try:
        sink = PostgresSink(server.dsn, "public.orders", uid="pg", create_table=True)
        sink.check(SCHEMA, APP)
        decided = [dump_handle(h) for h in _prepare(sink, 4, [[1, 2, 3], [4, 5]])]
        sink.release()
        server.kill()
        server.start()
        fresh = PostgresSink(server.dsn, "public.orders", uid="pg")
        commit(fresh, 4, [load_handle(doc) for doc in decided])
        commit(fresh, 4, [load_handle(doc) for doc in decided])  # a second recovery
        fresh.release()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM public.orders ORDER BY id")]
            staged = staged_names(conn, "public.orders", "txsink.")
    finally:
        server.stop()
    assert ids == [1, 2, 3, 4, 5] and staged == [], (ids, staged)


# -- with Spark: the cross-system move -----------------------------------------------------


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.s3
@pytest.mark.parametrize(
    ("point", "mode", "times"),
    [
        ("after_decision", "raise", 1),
        ("after_precommit", "kill-worker", 1),
        pytest.param("during_commit", "raise", 1, marks=pytest.mark.slow),
        pytest.param("during_recovery", "raise", 1, marks=pytest.mark.slow),
    ],
)
def test_kafka_postgres_s3_with_postgres_staged(
    spark: Any,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    postgres_stock: Any,
    point: str,
    mode: str,
    times: int,
) -> None:
    """One coordinator over Kafka, S3 and Postgres on a stock server (the staging commit):
    a crash at ``point``, restarts until done; every target read back by its own client,
    every epoch seen whole or not at all across the systems."""
    from cross import FILES, ROWS, Cross, observed

    from conftest import server_connectors, services_for
    from tests.streaming import fault_spec, is_task_point, prepare_input, run_until_done
    from txsink.protocol.faults import FaultPlan
    from txsink.testing.observer import input_epochs

    connectors = server_connectors()
    cross = Cross.create(
        connectors,
        services_for(request, connectors),
        tmp_path,
        options={"postgres": {"server": "stock"}},
    )
    try:
        assert cross.targets["postgres"].spec["server"] == "stock"
        prepare_input(cross.tmp, ROWS, FILES)
        plan = FaultPlan.parse(fault_spec(point, mode, times), str(cross.tmp / "faults"))
        restarts: list[int] = []

        def run() -> None:
            done = run_until_done(spark, cross.tmp, lambda: cross.coordinator(plan))
            restarts.append(done[0])

        report = observed(cross, run, expected=input_epochs(cross.tmp / "input"))
        assert len(plan.fired()) == len(plan.faults) * times, "the fault never fired"
        if not (is_task_point(point) and times == 1):
            assert restarts[0] >= 1
        cross.assert_exactly_once(ROWS, report)
        table = cross.targets["postgres"].spec["table"]
        assert _leftovers(postgres_stock, table) == []
    finally:
        cross.drop()


@pytest.mark.spark
@pytest.mark.timeout(2400)
def test_the_postgres_page_runs_on_a_stock_server(
    postgres_stock: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """docs/connectors/postgres.md, every block as written, with ``TXSINK_PG_DSN`` on a
    server as PostgreSQL ships: the quickstart and the other examples need no server
    change (``commit="auto"`` takes the staging commit)."""
    from tests import docblocks, docrun

    (page,) = [p for p in docblocks.pages() if p.path == "docs/connectors/postgres.md"]
    env = docrun.docs_env({"TXSINK_PG_DSN": postgres_stock.dsn})
    docrun.check_page(page, tmp_path, env, slow=docblocks.run_slow(request.config))
