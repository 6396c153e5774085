"""Schema evolution in the atomic move (issue #41, point 5): one coordinator over
PostgreSQL, Kafka (Avro values through the Schema Registry), S3, Iceberg and Delta, with
``schema_evolution="add-columns"``; the stream gains a column ``note`` at epoch 2
(``integration/evolving.py``), and the driver is SIGKILLed at the evolving epoch's crash
points (a child process restarted each time, as a supervisor would).

Afterwards, read with clients that are not txsink's (psycopg, confluent-kafka's
``AvroDeserializer``, pyiceberg, deltalake; S3 through its manifests): every target holds
every row once and nothing lingers (the verifiers), no target showed an epoch another did
not (the observer), and in every target the rows of the epochs before 2 have no ``note``
and those from 2 on have theirs: the new column arrived with the epoch that brought it, in
all five, and the log recorded one change per sink, in epoch 2.

The per-connector details (strict, refusals, each crash point raised in-process, what each
reader sees) are each connector's ``test_evolve_<name>.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cross import Cross, observed
from evolving import ADDED_AT, gains_a_column, note_of

from conftest import services_for
from tests.streaming import CRASH_MATRIX, fault_spec, is_task_point, kill_driver_at_every_point
from txsink.ops.schemas import schema_history
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import open_log
from txsink.testing.inputs import input_epochs, make_input

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.kafka,
    pytest.mark.postgres,
    pytest.mark.s3,
    pytest.mark.registry,
]

CONNECTORS = ("postgres", "kafka", "s3", "iceberg", "delta")
#: The evolving epoch's driver points, each killed once per run (a point a restart's
#: recovery skips needs a run of its own). By default: before its decision (nothing may
#: change), after it (recovery applies every change with the rows), and during that
#: recovery's commit; with --run-slow the other four as well.
KILLS = [
    pytest.param(("before_decision", "after_decision", "during_recovery"), id="decision"),
    pytest.param(
        ("before_precommit", "after_precommit", "during_commit"),
        id="precommit-commit",
        marks=pytest.mark.slow,
    ),
    pytest.param(("after_commit_before_mark",), id="before-mark", marks=pytest.mark.slow),
]
TRANSFORM = f"{Path(__file__).resolve().parent / 'evolving.py'}:gains_a_column"
ROWS = 600


@pytest.fixture
def evolving(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cross]:
    services = services_for(request, CONNECTORS)
    services["registry"] = request.getfixturevalue("schema_registry")
    made = Cross.create(CONNECTORS, services, tmp_path, {"kafka": {"value_format": "avro"}})
    for target in made.targets.values():
        target.spec["schema_evolution"] = "add-columns"
    yield made
    made.drop()


def _kill(point: str) -> str:
    """A kill of the driver at ``point`` of the evolving epoch; at a task point in one
    partition's task only (both tasks would kill it at once: one restart for two faults)."""
    return f"{point}:kill-driver@{ADDED_AT}" + ("#1" if is_task_point(point) else "")


@pytest.mark.parametrize("points", KILLS)
def test_five_targets_gain_a_column_in_one_epoch_under_driver_kills(
    evolving: Cross, points: tuple[str, ...]
) -> None:
    make_input(evolving.tmp / "input", ROWS, 6)  # the files the runner's helper writes
    expected = input_epochs(evolving.tmp / "input")
    ended: list[Any] = []

    def run() -> None:
        ended.append(
            kill_driver_at_every_point(
                evolving.tmp,
                evolving.specs(),
                evolving.child_env(),
                rows=ROWS,
                points=",".join(_kill(p) for p in points),
                transform=TRANSFORM,
                on_line=print,  # the children's lines, shown when the test fails
            )
        )

    report = observed(evolving, run, expected=expected)
    _check(evolving, expected, report, ROWS)


#: The in-process cells the default suite runs (the rest with --run-slow): the commit of the
#: evolving epoch cut after its first target showed it, and a task killed before its vote.
DEFAULT_CELLS = {("during_commit", "raise", 1), ("after_precommit", "kill-worker", 2)}


def _marks(cell: tuple[str, str, int]) -> tuple[Any, ...]:
    if cell == ("during_commit", "raise", 1):  # the compatibility matrix's cell
        return (pytest.mark.matrix("schema_evolution"),)
    return () if cell in DEFAULT_CELLS else (pytest.mark.slow,)


class _Shaped:
    """``foreachBatch``: the coordinator, called with each batch in its epoch's shape."""

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator

    def __call__(self, df: Any, batch_id: int) -> None:
        self.coordinator(gains_a_column(df, batch_id), batch_id)

    def close(self) -> None:
        self.coordinator.close()


@pytest.mark.spark
@pytest.mark.parametrize(
    ("point", "mode", "times"),
    [pytest.param(*cell, marks=_marks(cell)) for cell in CRASH_MATRIX],
)
def test_five_targets_gain_a_column_under_the_crash_matrix(
    spark: Any, evolving: Cross, point: str, mode: str, times: int
) -> None:
    """Every crash point of the matrix, raised or killing a task, at the evolving epoch,
    in the shared Spark session; the query restarted after each failure."""
    from tests.streaming import prepare_input, run_until_done

    rows, files = 400, 4
    prepare_input(evolving.tmp, rows, files)
    expected = input_epochs(evolving.tmp / "input")
    plan = FaultPlan.parse(fault_spec(point, mode, times, ADDED_AT), str(evolving.tmp / "faults"))

    def run() -> None:
        run_until_done(spark, evolving.tmp, lambda: _Shaped(evolving.coordinator(plan)))

    report = observed(evolving, run, expected=expected)
    assert len(plan.fired()) == len(plan.faults) * times, "the fault never fired"
    _check(evolving, expected, report, rows)


def _check(evolving: Cross, expected: dict[int, list[int]], report: Any, rows: int) -> None:
    """Exactly once everywhere (verifiers, observer); one change per sink in the evolving
    epoch; and in every target each row's note as its epoch's shape had it."""
    evolving.assert_exactly_once(rows, report)
    # One change per sink, in epoch 2. Kafka's may be missing: the attempt killed before
    # the decision had registered the new version in its tasks (a version no record
    # references, docs/schema-evolution.md), so the retried epoch found it in the subject.
    history = schema_history(open_log(evolving.log))
    assert {e.change.describe() for e in history} == {"adds note (string)"}
    assert {e.epoch for e in history} == {ADDED_AT}
    uids = evolving.uids
    assert {uids[c] for c in CONNECTORS if c != "kafka"} <= {e.sink for e in history}
    _notes_match(evolving, expected, rows)


def _notes_match(evolving: Cross, expected: dict[int, list[int]], rows: int) -> None:
    """In every target, each row's note as its epoch's shape had it (readers not ours)."""
    epoch_of = {i: e for e, ids in expected.items() for i in ids}
    for name, read in READERS.items():
        notes = read(evolving, name)
        assert sorted(notes) == list(range(rows)), f"{name}: not every row read back"
        wrong = {
            i: n for i, n in notes.items() if n != (note_of(i) if epoch_of[i] >= ADDED_AT else None)
        }
        assert not wrong, f"{name}: rows whose note does not match their epoch: {wrong}"


# -- readers that are not txsink's: id -> note ---------------------------------------------


def _postgres(cross: Cross, name: str) -> dict[int, Any]:
    import psycopg
    from psycopg import sql

    verifier: Any = cross.targets[name].verifier([], log=cross.log)
    query = sql.SQL("SELECT id, note FROM {}").format(sql.Identifier(*verifier.table.split(".")))
    with psycopg.connect(verifier.dsn, autocommit=True) as conn:
        return {int(i): n for i, n in conn.execute(query).fetchall()}


def _kafka(cross: Cross, name: str) -> dict[int, Any]:
    verifier: Any = cross.targets[name].verifier([], log=cross.log)
    return {int(v["id"]): v.get("note") for v in verifier.read_values()}


def _s3(cross: Cross, name: str) -> dict[int, Any]:
    verifier: Any = cross.targets[name].verifier([], log=cross.log)
    table = verifier.read_table(["id", "note"])
    return dict(zip(table["id"].to_pylist(), table["note"].to_pylist(), strict=True))


def _iceberg(cross: Cross, name: str) -> dict[int, Any]:
    from txsink.connectors.iceberg import catalog as cat
    from txsink.connectors.iceberg.testing import catalog_properties

    target = cross.targets[name]
    props = catalog_properties(target.spec, target.env)
    table = cat.load_catalog(target.spec["catalog_name"], props).load_table(target.spec["table"])
    data = table.scan(selected_fields=("id", "note")).to_arrow()
    return dict(zip(data["id"].to_pylist(), data["note"].to_pylist(), strict=True))


def _delta(cross: Cross, name: str) -> dict[int, Any]:
    from deltalake import DeltaTable

    verifier: Any = cross.targets[name].verifier([], log=cross.log)
    data = DeltaTable(verifier.table, storage_options=dict(verifier.options) or None)
    table = data.to_pyarrow_table(columns=["id", "note"])
    return dict(zip(table["id"].to_pylist(), table["note"].to_pylist(), strict=True))


READERS: dict[str, Callable[[Cross, str], dict[int, Any]]] = {
    "postgres": _postgres,
    "kafka": _kafka,
    "s3": _s3,
    "iceberg": _iceberg,
    "delta": _delta,
}


# -- a target's server dies at the evolving epoch ----------------------------------------

#: (the fault plan, which private servers): PostgreSQL dies with the decision made (its
#: ALTER TABLE and the move happen after its restart), the broker likewise, MinIO during the
#: commit (some targets already evolved), and every server with a task's writes prepared.
TARGET_KILLS = [
    f"after_decision:kill-target=postgres@{ADDED_AT}",
    f"after_decision:kill-target=kafka@{ADDED_AT}",
    f"during_commit:kill-target=s3@{ADDED_AT}",
    f"after_precommit:kill-target@{ADDED_AT}#0",
]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("plan", TARGET_KILLS)
def test_five_targets_gain_a_column_when_a_target_server_dies(
    request: pytest.FixtureRequest, tmp_path: Path, plan: str
) -> None:
    """Private PostgreSQL (the table and Iceberg's catalog), MinIO (S3 and Iceberg's
    warehouse) and Kafka servers, SIGKILLed at the evolving epoch by ``kill-target`` and
    started again before the query restarts (:func:`txsink.testing.run_chaos`); every
    target then reads back every row once, its note as its epoch had it."""
    import os

    from crashable_targets import CrashableKafka, CrashableMinio, CrashablePostgres

    from txsink.testing import run_chaos
    from txsink.testing.targets import child_env, new_targets

    registry = request.getfixturevalue("schema_registry")
    pg = CrashablePostgres.create()
    minio = CrashableMinio.create(tmp_path / "minio")
    kafka = CrashableKafka.create(tmp_path / "kafka")
    servers: dict[str, Any] = {"postgres": pg, "s3": minio, "kafka": kafka}
    env = {**os.environ, "TXSINK_PG_DSN": pg.dsn, **minio.env(), **registry.env()}
    env["TXSINK_KAFKA_BOOTSTRAP"] = kafka.bootstrap
    try:
        make_input(tmp_path / "input", ROWS, 6)
        expected = input_epochs(tmp_path / "input")
        options = {"kafka": {"value_format": "avro"}}
        made = new_targets(list(CONNECTORS), tmp_path, tag="xevo", env=env, options=options)
        for target in made:
            target.spec["schema_evolution"] = "add-columns"
        log = str(tmp_path / "txlog")
        args = {"workdir": str(tmp_path), "sinks": [t.spec for t in made], "log": log}
        report = run_chaos(
            "txsink.testing.pipelines:run_stream",
            plan,
            workdir=tmp_path,
            sinks_verifiers={t.connector: t.verifier(range(ROWS), log=log) for t in made},
            args={**args, "transform": TRANSFORM},
            env={**env, **child_env(made)},
            targets=servers,
            down_s=1.0,
            observe=[view for t in made for view in t.observer_targets()],
            expected_epochs=expected,
        )
        assert report.ok, report.table()
        assert report.target_kills and report.restarts >= 1, report.table()
        cross = Cross({t.connector: t for t in made}, {}, tmp_path, list(made))
        _notes_match(cross, expected, ROWS)
    finally:
        for server in servers.values():
            server.stop()
