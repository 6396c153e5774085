"""Every crash point and mode, for every registered connector and variant, on a real query.

The crash matrix (``tests/streaming.py``: driver points raise; task points raise or kill
the Python worker, once — Spark's task retry absorbs it — or twice — the query fails and
restarts) runs in the shared SparkSession; the kill-driver run crashes a child process at
every point once. Each ends with the target read back by the connector's verifier: zero
duplicates, zero missing, nothing lingering. A new connector gets these by registering
its testing adapter.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from conftest import variant_target
from tests.streaming import (
    CRASH_MATRIX,
    EVERY_POINT_ONCE,
    SINGLE_PASS_MATRIX,
    fault_spec,
    is_task_point,
    kill_driver_at_every_point,
    prepare_input,
    run_until_done,
)
from txsink import Coordinator
from txsink.protocol.faults import CrashPoint, FaultPlan
from txsink.protocol.log import open_log
from txsink.testing.adapter import adapters
from txsink.testing.targets import RunTarget, child_env
from txsink.testing.verifiers import assert_audited, verify

ROWS = 1000
#: Input files, one epoch each: the faults hit epoch 1, and epoch 2 shows the query going
#: on normally after the recovery (a fourth epoch, as before, showed nothing more).
FILES = 3
#: The cells a connector's ``slow_variants`` run by default (the others with --run-slow): a
#: crash after the decision, one between the commit's units, a worker killed after its
#: pre-commit.
QUICK_CELLS = {
    ("after_decision", "raise", 1),
    ("during_commit", "raise", 1),
    ("after_precommit", "kill-worker", 1),
}
#: The cells a connector's other variants than its first run by default: where a variant's
#: own code runs (its pre-commit's leftovers, its commit, its recovery's commit), plus the
#: single-pass points for variants that commit in their tasks. The other cells test the
#: core's protocol and Spark's task retries, the same for every variant: the first variant
#: runs them all, and --run-slow runs them for every variant.
VARIANT_CELLS = QUICK_CELLS | {("during_recovery", "raise", 1)} | set(SINGLE_PASS_MATRIX)


#: The compatibility matrix's subset (``--matrix``, run on every Spark line: tests/matrixrun.py):
#: one cell per crash point, spread over files, Postgres, Kafka WAL and direct, S3, Iceberg
#: and Delta, each a cell the default suite runs too (none of them slow).
MATRIX_CELLS: dict[tuple[str, str, str, str, int], str] = {
    ("files", "parquet", "before_precommit", "kill-worker", 1): "foreachBatch",
    ("kafka", "wal", "after_precommit", "kill-worker", 1): "foreachBatch",
    ("s3", "parquet", "before_decision", "raise", 1): "foreachBatch",
    ("iceberg", "sql-s3", "after_decision", "raise", 1): "foreachBatch",
    ("delta", "local", "after_commit_before_mark", "raise", 1): "foreachBatch",
    ("postgres", "append", "during_recovery", "raise", 1): "foreachBatch",
    ("kafka", "direct", "during_commit", "raise", 1): "direct",
    ("kafka", "direct", "before_task_commit", "kill-worker", 1): "direct",
}


def _matrix(connector: str, variant: str, cell: tuple[str, str, int]) -> list[Any]:
    feature = MATRIX_CELLS.get((connector, variant, *cell))
    return [pytest.mark.matrix(feature)] if feature else []


def _variants() -> list[tuple[str, str, list[Any]]]:
    return [
        (name, variant, [getattr(pytest.mark, s) for s in found.services])
        for name, found in adapters().items()
        for variant in found.variants
    ]


def _cells() -> list[tuple[str, str, list[Any], tuple[str, str, int]]]:
    """Every variant by the crash matrix, and the single-pass points where they apply."""
    return [
        (name, variant, marks, cell)
        for name, variant, marks in _variants()
        for cell in CRASH_MATRIX
        + (SINGLE_PASS_MATRIX if variant in adapters()[name].single_pass_variants else [])
    ]


#: The "fault twice" cells every connector's first variant runs by default: a killed worker's
#: prepared transaction left by both attempts, then the query's restart (its recovery finds
#: and aborts them). The other three "twice" cells test Spark's retries and the core's
#: restart, not the connector: the files connector runs them by default, the others with
#: --run-slow.
TWICE_FOR_ALL = {("after_precommit", "kill-worker", 2)}
TWICE_CONNECTOR = "files"


def _slow(connector: str, variant: str, cell: tuple[Any, ...] | None = None) -> list[Any]:
    """``[pytest.mark.slow]`` for a cell (None: the kill-driver run) of a slow variant, for
    the cells of a connector's other variants outside :data:`VARIANT_CELLS`, and for the
    "twice" cells outside :data:`TWICE_FOR_ALL` of connectors other than the files one."""
    found = adapters()[connector]
    slow = variant in found.slow_variants and cell not in QUICK_CELLS
    first = variant == next(iter(found.variants))
    other = cell is not None and cell not in VARIANT_CELLS and not first
    twice = (
        cell is not None
        and cell[-1] == 2
        and cell not in TWICE_FOR_ALL
        and connector != TWICE_CONNECTOR
    )
    return [pytest.mark.slow] if slow or other or twice else []


def test_the_matrix_subset_has_one_cell_per_crash_point() -> None:
    """:data:`MATRIX_CELLS`: every named crash point once, over files, Postgres, Kafka WAL
    and direct, S3, Iceberg and Delta, each a registered variant's cell, none slow."""
    assert sorted(cell[2] for cell in MATRIX_CELLS) == sorted(str(p) for p in CrashPoint)
    targets = {(c[0], c[1]) for c in MATRIX_CELLS}
    assert {c for c, _ in targets} == {"files", "postgres", "kafka", "s3", "iceberg", "delta"}
    assert {("kafka", "wal"), ("kafka", "direct")} <= targets
    cells = {(name, variant, *cell) for name, variant, _, cell in _cells()}
    for connector, variant, *cell in MATRIX_CELLS:
        assert (connector, variant, *cell) in cells, (connector, variant, cell)
        assert _slow(connector, variant, tuple(cell)) == [], (connector, variant, cell)


def _target(request: pytest.FixtureRequest, tmp: Path, connector: str, variant: str) -> RunTarget:
    return variant_target(request, tmp, connector, variant, tag="mx")


@pytest.mark.spark
@pytest.mark.parametrize(
    ("connector", "variant", "point", "mode", "times"),
    [
        pytest.param(
            name,
            variant,
            *cell,
            marks=[*marks, *_slow(name, variant, cell), *_matrix(name, variant, cell)],
            id=f"{name}-{variant}-{'-'.join(map(str, cell))}",
        )
        for name, variant, marks, cell in _cells()
    ],
)
def test_crash_matrix(
    spark: Any,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    connector: str,
    variant: str,
    point: str,
    mode: str,
    times: int,
) -> None:
    run_cell(spark, tmp_path, _target(request, tmp_path, connector, variant), point, mode, times)


def run_cell(
    spark: Any, tmp_path: Path, target: RunTarget, point: str, mode: str, times: int
) -> None:
    """One crash-matrix cell on ``target``: the query run until done under the fault, then
    the target read back by its connector's verifier (also the secured profile's,
    ``test_secure_matrix.py``)."""
    prepare_input(tmp_path, ROWS, FILES)
    task_point = is_task_point(point)
    plan = FaultPlan.parse(fault_spec(point, mode, times), str(tmp_path / "faults"))
    # Driver-side points also exercise a log kept in the target's system, if it has one.
    store = None if task_point else target.adapter.log_store(target.spec, target.env)
    log = store or str(tmp_path / "txlog")
    restarts, _ = run_until_done(
        spark, tmp_path, lambda: Coordinator([target.sink()], log=log, faults=plan)
    )
    assert len(plan.fired()) == len(plan.faults) * times, "the fault never fired: test is void"
    if task_point and times == 1:
        assert restarts == 0, "a retried task attempt must not fail the query"
    else:
        assert restarts >= 1
    verdict = verify(target.verifier(range(ROWS), log=log if isinstance(log, str) else None))
    assert verdict.ok, verdict
    assert_audited(log, [target.sink()])  # and the decisions' own promise, epoch by epoch
    txlog = open_log(log)
    assert txlog.pending() == []
    assert [s.status for s in txlog.states()].count("committed") == FILES
    if store is not None:
        assert store.list("epochs/"), "the log in the target's system was not used"


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.parametrize(
    ("connector", "variant"),
    [
        # By default the cross-system kill-driver run (test_cross_system.py) covers the
        # first variant of every connector with a server and its single-pass variant in
        # one coordinator, and the demo's (tests/test_demo.py) the files connector: these
        # one-variant runs are --run-slow's.
        pytest.param(name, variant, marks=marks, id=f"{name}-{variant}")
        for name, variant, marks in _variants()
    ],
)
def test_kill_driver_at_every_point(
    request: pytest.FixtureRequest, tmp_path: Path, connector: str, variant: str
) -> None:
    target = _target(request, tmp_path, connector, variant)
    single_pass = variant in adapters()[connector].single_pass_variants
    run_kill_driver(tmp_path, [target], single_pass=single_pass)


def run_kill_driver(
    tmp_path: Path,
    targets: Sequence[RunTarget],
    *,
    single_pass: bool = False,
    points: str | None = None,
) -> None:
    """The kill-driver run into ``targets`` (one coordinator; ``points``: default every
    point once), in child processes, then each target read back by its connector's
    verifier (also the secured profile's, ``test_secure_matrix.py``)."""
    report = kill_driver_at_every_point(
        tmp_path,
        [t.spec for t in targets],
        child_env(targets),
        single_pass=single_pass,
        points=EVERY_POINT_ONCE if points is None else points,
    )
    if single_pass:
        assert any("before_task_commit" in e for e in report.endings), report.endings
    log = str(tmp_path / "txlog")
    for target in targets:
        verdict = verify(target.verifier(range(3000), log=log))
        assert verdict.ok, (target.connector, verdict)
    assert_audited(log, [t.sink() for t in targets])
