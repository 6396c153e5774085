"""The cross-system atomic move: one coordinator, Kafka (WAL) + Postgres + S3, under chaos.

Every test runs one streaming query into the three targets while an
:class:`~txsink.testing.observer.Observer` samples them (Kafka ``read_committed``, committed
Postgres rows, S3 manifests; an S3 listing and a Kafka ``read_uncommitted`` consumer as
boundary views), then checks:

- exactly-once in each target: zero duplicates, zero missing, zero lingering (no open Kafka
  transaction: LSO == HW and no WAL file left; no prepared Postgres transaction of ours;
  no multipart upload or upload marker left);
- zero observer violations: no epoch shown by one target and never by another, nothing
  taken back;
- and records the visibility skew per epoch (printed at the end of the session).

Faults: the crash matrix (task and driver points, ``raise`` / ``kill-worker``) in the
shared Spark session; SIGKILL of the driver at every point in a child process; and network
faults (cut or stall the connection to one target through a proxy during pre-commit,
commit or recovery, restored before the restart).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from cross import FILES, ROWS, Cross, observed

from tests.streaming import (
    CRASH_MATRIX,
    EVERY_POINT_ONCE,
    SOME_POINTS,
    fault_spec,
    is_task_point,
    kill_driver_at_every_point,
)
from txsink.protocol.faults import FaultPlan
from txsink.testing.hooks import PointHooks
from txsink.testing.observer import (
    ObserverReport,
    input_epochs,
)
from txsink.testing.targets import child_env
from txsink.testing.verifiers import verify

pytestmark = [pytest.mark.chaos, pytest.mark.kafka, pytest.mark.postgres, pytest.mark.s3]

# -- skew bookkeeping --------------------------------------------------------------------


@dataclass
class SkewLog:
    """Every observed epoch's skew in this session, summarised at its end."""

    runs: list[tuple[str, ObserverReport]] = field(default_factory=list)

    def add(self, name: str, report: ObserverReport) -> None:
        self.runs.append((name, report))
        print(f"\n[{name}] {report.table()}")

    def summary(self) -> list[str]:
        skews = [s for _, r in self.runs for s in r.skews]
        complete = [s for _, r in self.runs for s in r.complete_skews]
        if not skews:
            return []
        leads = [
            lead
            for _, r in self.runs
            for e in r.epochs.values()
            if (lead := e.lead("s3-listing")) is not None
        ]
        partial: dict[str, float] = {}
        for _, r in self.runs:
            for t in r.guaranteed:
                p = r.partial_max(t)
                if p is not None:
                    partial[t] = max(partial.get(t, 0.0), p)
        stats = {
            "runs": len(self.runs),
            "epochs": len(skews),
            "skew_median_s": round(statistics.median(skews), 3),
            "skew_max_s": round(max(skews), 3),
            "complete_skew_median_s": round(statistics.median(complete), 3) if complete else None,
            "complete_skew_max_s": round(max(complete), 3) if complete else None,
            "s3_listing_lead_max_s": round(max(leads), 3) if leads else None,
            "partial_max_s": {t: round(p, 3) for t, p in partial.items()},
            "at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        }
        return ["cross-system visibility skew: " + json.dumps(stats)]


@pytest.fixture(scope="session")
def skew_log(request: pytest.FixtureRequest) -> Iterator[SkewLog]:
    log = SkewLog()
    yield log
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    for line in log.summary():
        if reporter is not None:
            reporter.write_line(line)
        else:  # pragma: no cover - pytest always has one unless disabled
            print(line)


# -- the crash matrix --------------------------------------------------------------------

#: The cells the default suite runs, so that every crash point still faults the
#: cross-system move by default: ``before_decision``, ``after_commit_before_mark`` and
#: ``during_recovery`` here (raised in the test's own driver: the coordinator rebuilt in the
#: same process), ``after_decision`` and ``during_commit`` killed in
#: :func:`test_kill_driver_at_every_point`, ``during_commit`` raised in
#: :func:`test_crash_mid_commit_shows_part_of_an_epoch_until_the_restart` (the cell's plan
#: and more checks); and one cell per task point that fails the query (a fault twice:
#: Spark's retry gives up, the restart's recovery aborts what every target prepared), one
#: raising and one killing the worker. The other 8 cells run with --run-slow (a task fault
#: once is absorbed by Spark's retry: integration/test_matrix.py runs those per connector).
DEFAULT_CELLS = {
    ("before_decision", "raise", 1),
    ("after_commit_before_mark", "raise", 1),
    ("during_recovery", "raise", 1),
    ("before_precommit", "raise", 2),
    ("after_precommit", "kill-worker", 2),
}
#: The plan of :func:`test_crash_mid_commit_shows_part_of_an_epoch_until_the_restart`.
MID_COMMIT_PLAN = "during_commit:raise@1"


def _matrix_params() -> list[Any]:
    return [
        pytest.param(*cell, marks=() if cell in DEFAULT_CELLS else (pytest.mark.slow,))
        for cell in CRASH_MATRIX
    ]


def test_the_default_cells_reach_every_crash_point_mode_and_network_fault() -> None:
    """The default suite's cross-system cells still fault at every point of the matrix, and
    in every mode (raise, kill-worker; kill-driver: :func:`test_kill_driver_at_every_point`);
    its network faults reach every target, in every phase, cut and stalled."""
    assert set(CRASH_MATRIX) > DEFAULT_CELLS  # a strict subset
    killed = {f.partition(":")[0] for f in SOME_POINTS.split(",")}
    raised = {MID_COMMIT_PLAN.partition(":")[0]}
    assert {c[0] for c in DEFAULT_CELLS} | killed | raised == {c[0] for c in CRASH_MATRIX}
    assert {c[1] for c in DEFAULT_CELLS} == {c[1] for c in CRASH_MATRIX}
    assert {c[0] for c in DEFAULT_NET} == {"kafka", "postgres", "s3"}
    assert {c[1] for c in DEFAULT_NET} == set(PHASES)
    assert {c[2] for c in DEFAULT_NET} == {"cut", "stall"}


@pytest.mark.spark
@pytest.mark.parametrize(("point", "mode", "times"), _matrix_params())
def test_cross_system_crash_matrix(
    spark: Any, cross: Cross, skew_log: SkewLog, point: str, mode: str, times: int
) -> None:
    from tests.streaming import prepare_input, run_until_done

    prepare_input(cross.tmp, ROWS, FILES)
    plan = FaultPlan.parse(fault_spec(point, mode, times), str(cross.tmp / "faults"))
    restarts: list[int] = []

    def run() -> None:
        restarts.append(run_until_done(spark, cross.tmp, lambda: cross.coordinator(plan))[0])

    report = observed(cross, run, expected=input_epochs(cross.tmp / "input"))
    skew_log.add(f"{point}:{mode}*{times}", report)
    assert len(plan.fired()) == len(plan.faults) * times, "the fault never fired"
    if not (is_task_point(point) and times == 1):
        assert restarts[0] >= 1
    cross.assert_exactly_once(ROWS, report)


@pytest.mark.spark
def test_crash_mid_commit_shows_part_of_an_epoch_until_the_restart(
    spark: Any, cross: Cross, skew_log: SkewLog
) -> None:
    """A crash in the middle of the commit, and a pause before the restart: the boundary.

    After ``during_commit:raise`` epoch 1 is decided and the first unit of the first sink
    (in commit order) is committed: Kafka's shards today (the cross coordinator's sinks
    are in registry order), committed by parallel tasks and reported together. That target
    shows epoch 1, the others nothing, for as long as the query is down. The restart's
    recovery then makes epoch 1 whole in every target; nothing is taken back."""
    from tests.streaming import prepare_input, start_query

    prepare_input(cross.tmp, ROWS, FILES)
    plan = FaultPlan.parse(MID_COMMIT_PLAN, str(cross.tmp / "faults"))

    def run() -> None:
        query = start_query(spark, cross.tmp, cross.coordinator(plan))
        with pytest.raises(Exception, match="InjectedFault"):
            query.awaitTermination()
        time.sleep(1.0)  # let the observer see the in-between state
        start_query(spark, cross.tmp, cross.coordinator()).awaitTermination()

    report = observed(cross, run, expected=input_epochs(cross.tmp / "input"))
    skew_log.add("during_commit+pause", report)
    cross.assert_exactly_once(ROWS, report)
    epoch1 = report.epochs[1]
    # Every guaranteed target shows epoch 1 in the end; the first sink showed it during
    # the pause, the others did not, so the skew spans the pause.
    first_views = [t.name for t in next(iter(cross.targets.values())).observer_targets()]
    skew = epoch1.skew
    assert skew is not None and skew >= 0.5, report.table()
    # The earliest sighting is one of the first sink's views: its guaranteed view or a
    # boundary view of the same target (a read_uncommitted reader can see the committed
    # shard a poll before the read_committed one does; both are that sink's target).
    earliest = min(epoch1.first_seen, key=epoch1.first_seen.__getitem__)
    assert earliest in first_views, report.table()


@pytest.mark.parametrize(
    "points",
    [
        pytest.param(SOME_POINTS, id="some-points"),
        pytest.param(EVERY_POINT_ONCE, id="every-point", marks=pytest.mark.slow),
    ],
)
def test_kill_driver_at_every_point(cross: Cross, skew_log: SkewLog, points: str) -> None:
    """SIGKILL of the driver at every crash point (a child process restarted each time),
    with every connector's single-pass variant (Kafka's direct mode) in the same
    coordinator: every epoch runs in one pass, the other sinks' handles in the same votes,
    and the driver is also killed at the single-pass point (``before_task_commit``).

    This is the default suite's kill-driver run for each connector with a server and for
    its single-pass variant, at the points where recovery has the most to do
    (``some-points``; ``every-point`` with --run-slow, and integration/test_matrix.py
    runs them one by one); the demo's (tests/test_demo.py) is the files connector's, and
    the one of a coordinator without a single-pass sink, at every point."""
    from txsink.testing.inputs import make_input

    rows = 600
    extra = cross.single_pass_targets()
    assert extra, "no connector has a single-pass variant: this run is not single-pass"
    make_input(cross.tmp / "input", rows, 6)  # the same files the helper writes
    expected = input_epochs(cross.tmp / "input")
    ended: list[Any] = []

    def run() -> None:
        specs = cross.specs() + [t.spec for t in extra]
        env = {**cross.child_env(), **child_env(extra)}
        ended.append(
            kill_driver_at_every_point(
                cross.tmp, specs, env, rows=rows, single_pass=True, points=points
            )
        )

    report = observed(cross, run, expected=expected)
    skew_log.add("kill-driver at every point", report)
    assert any("before_task_commit" in e for e in ended[0].endings), ended[0].endings
    cross.assert_exactly_once(rows, report)
    for target in extra:
        verdict = verify(target.verifier(range(rows), log=cross.log))
        assert verdict.ok, f"{target.uid}: not exactly-once: {verdict}"


# -- network faults ----------------------------------------------------------------------

#: (phase, the crash point the fault is injected at, extra faults that make it reachable)
PHASES = {
    "precommit": ("before_precommit", ""),
    "commit": ("during_commit", ""),
    "recovery": ("during_recovery", "during_commit:raise@1"),
}
STALL_S = 12.0
#: Per target, the sink's client timeout during these tests: a cut shows as a call that
#: times out, and the Kafka sink waits ``timeout_s`` (30 s by default) for each; 10 s
#: fails the same calls the same way a third as long, and is still far above a call's
#: time on a busy machine (the restarts' calls, after the heal, must not time out).
NET_TIMEOUT_S = {"kafka": 10.0}
#: The default suite's cells: each target once, each phase once, each kind (cut, stall) at
#: least once. The other 15 (target, phase, kind) cells run with --run-slow, among them
#: ("postgres", "commit", "stall") and ("s3", "commit", "cut"), the default cells before
#: the suite's time budget (a stall at the commit: here S3's; a cut at the commit: Kafka's).
DEFAULT_NET = {
    ("kafka", "commit", "cut"),
    ("postgres", "precommit", "cut"),
    ("s3", "recovery", "stall"),
}
# Not ("kafka", "recovery", "cut"): Kafka is the first sink in commit order, and
# ``during_recovery`` (like ``during_commit``) fires once the first sink's share is committed,
# so that cut reaches Kafka only at the next epoch's commit, as ("kafka", "commit", "cut")
# does; a cut inside Kafka's own recovery needs a fault point before its first commit.


def _net_params() -> list[Any]:
    return [
        pytest.param(
            target,
            phase,
            kind,
            marks=() if (target, phase, kind) in DEFAULT_NET else (pytest.mark.slow,),
        )
        for target in ("kafka", "postgres", "s3")
        for phase in PHASES
        for kind in ("cut", "stall")
    ]


@pytest.mark.spark
@pytest.mark.parametrize(("target", "phase", "kind"), _net_params())
def test_network_fault_to_one_target(
    spark: Any, cross: Cross, skew_log: SkewLog, target: str, phase: str, kind: str
) -> None:
    """Cut (connections reset, new ones refused) or stall (no bytes for STALL_S seconds,
    longer than the S3 and Kafka client timeouts and the Postgres sink's stall_timeout_s) the
    connection from the sinks to ONE target while the protocol is at ``phase`` of epoch 1.
    The connection is restored before every restart; each target must read back exactly
    once, and the observer must see no epoch that one target shows and another never does."""
    from tests.streaming import prepare_input, run_until_done

    proxy, address = cross.services[target].with_proxy()
    if target in NET_TIMEOUT_S:
        cross.targets[target].spec["timeout_s"] = NET_TIMEOUT_S[target]
    cross.route(target, address)
    prepare_input(cross.tmp, ROWS, FILES)
    point, extra = PHASES[phase]
    hooks = PointHooks(cross.tmp / "hooks")
    timers: list[threading.Timer] = []

    def fault() -> None:
        if kind == "cut":
            proxy.cut()
            return
        proxy.stall()
        timer = threading.Timer(STALL_S, proxy.heal)
        timer.start()
        timers.append(timer)

    hooks.at(point, fault, epoch=1, partition=1 if point == "before_precommit" else None)
    plan = hooks.plan(FaultPlan.parse(extra, str(cross.tmp / "faults")))
    made: list[int] = []

    def make() -> Any:
        if made:
            proxy.heal()  # the network is back before the restart
        made.append(1)
        # The network stays cut until this restart: nothing to ride out (outage_s=0).
        return cross.coordinator(plan, outage_s=0)

    restarts: list[int] = []

    def run() -> None:
        with hooks:
            restarts.append(run_until_done(spark, cross.tmp, make, max_runs=6)[0])

    try:
        report = observed(cross, run, expected=input_epochs(cross.tmp / "input"))
    finally:
        for timer in timers:
            timer.cancel()
        proxy.heal()
    skew_log.add(f"network {kind} {target} during {phase}", report)
    assert hooks.fired, "the network fault was never injected"
    assert not hooks.errors, hooks.errors
    assert proxy.stats.accepted > 0, "the sink did not go through the proxy"
    cross.assert_exactly_once(ROWS, report)
