"""Chaos on a Spark standalone cluster: executor JVMs and drivers SIGKILLed, files sink, and
the sinks that commit in their tasks (Kafka's direct mode: single-pass epochs).

The cluster profile (markers ``cluster`` and ``chaos``): ``integration/cluster.py`` starts a
master and two workers (separate JVMs) once per session; every query runs in a child process
(``python -m txsink.runner txsink.testing.pipelines:run_stream``) with ``master=spark://...``,
restarted after each crash. The child processes keep the cluster's driver apart from the
shared local SparkSession of the root conftest (one SparkSession per Python process).

Each run is judged by reading the files sink back through its manifests: zero duplicates,
zero missing, zero lingering staged files, every epoch committed and nothing pending. A
single-pass run is read back by its connector's verifier (Kafka: ``read_committed``, and a
partition whose last stable offset is behind its high watermark counts as lingering).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, ClusterError, start_cluster, submit_args

from conftest import services_for, variant_params
from txsink.connectors.files.testing import FilesVerifier, verify_files
from txsink.protocol.log import EpochState, open_log
from txsink.testing import run_chaos
from txsink.testing.adapter import adapters
from txsink.testing.chaos import ChaosReport
from txsink.testing.inputs import make_input
from txsink.testing.targets import new_targets
from txsink.testing.verifiers import SinkVerifier

pytestmark = [pytest.mark.cluster, pytest.mark.chaos]

PIPELINE = "txsink.testing.pipelines:run_stream"
ROWS_PER_EPOCH = 200


@dataclass(frozen=True)
class ClusterSpark:
    """How a child process's SparkSession reaches the cluster."""

    cluster: Cluster
    master: str
    env: dict[str, str]


@pytest.fixture(scope="session")
def cluster_spark() -> Iterator[ClusterSpark]:
    """A standalone master + two workers (1 core, 1 GiB each) for the whole session."""
    try:
        cluster = start_cluster()
    except (ClusterError, OSError) as err:
        pytest.fail(f"the Spark standalone cluster did not start: {err}")
    sys.stderr.write(
        f"\nspark standalone cluster {cluster.master_url} up in {cluster.start_seconds:.1f}s\n"
    )
    env = {
        "PYSPARK_SUBMIT_ARGS": submit_args(cluster),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    try:
        yield ClusterSpark(cluster, cluster.master_url, env)
    finally:
        cluster.stop()


def run_on_cluster(
    cs: ClusterSpark, workdir: Path, plan: str, *, epochs: int = 3, max_runs: int = 8
) -> ChaosReport:
    """Run the files pipeline on the cluster under ``plan``; assert exactly-once; the report."""
    rows = ROWS_PER_EPOCH * epochs
    report = _run_chaos_on_cluster(
        cs,
        workdir,
        plan,
        sinks=[{"kind": "files", "path": str(workdir / "output")}],
        verifiers={"files": FilesVerifier(workdir / "output", range(rows))},
        epochs=epochs,
        max_runs=max_runs,
    )
    verdict = verify_files(workdir / "output", range(rows))
    assert (verdict.duplicates, verdict.missing, verdict.unexpected, verdict.lingering) == (
        0,
        0,
        0,
        0,
    ), verdict
    assert verdict.epochs == epochs, verdict
    return report


def _run_chaos_on_cluster(
    cs: ClusterSpark,
    workdir: Path,
    plan: str,
    *,
    sinks: list[dict[str, Any]],
    verifiers: dict[str, SinkVerifier],
    env: dict[str, str] | None = None,
    epochs: int,
    max_runs: int,
    lines: list[str] | None = None,
) -> ChaosReport:
    """Run the pipeline into ``sinks`` on the cluster under ``plan`` until it is done: every
    fault fired, every verifier's verdict clean, every epoch committed in the log.
    ``lines``: gets what the driver processes printed."""
    make_input(workdir / "input", ROWS_PER_EPOCH * epochs, epochs)
    lines = [] if lines is None else lines
    report = run_chaos(
        PIPELINE,
        plan,
        workdir=workdir,
        args={"workdir": str(workdir), "sinks": sinks, "master": cs.master},
        sinks_verifiers=verifiers,
        env={**cs.env, **(env or {})},
        max_runs=max_runs,
        timeout=300,
        on_progress=lines.append,
    )
    context = report.table() + "\n" + "\n".join(lines[-40:])
    assert report.finished, context
    assert len(report.faults_fired) == report.faults_planned, "a fault never fired\n" + context
    report.assert_ok()
    log = open_log(workdir / "txlog")
    assert log.pending() == []
    assert [s.status for s in log.states()].count("committed") == epochs
    return report


def _executors_killed(workdir: Path) -> int:
    """Firings recorded in the fault markers (each names the Python worker that fired)."""
    return len(os.listdir(workdir / "faults"))


# -- default profile: about 3 minutes on 2 cores, cluster start included ------------------


def test_executor_killed_once_per_task_point_is_absorbed(
    cluster_spark: ClusterSpark, tmp_path: Path
) -> None:
    """One executor SIGKILLed before and one after the pre-commit: Spark reruns the task."""
    report = run_on_cluster(
        cluster_spark,
        tmp_path,
        "before_precommit:kill-executor@0#1,after_precommit:kill-executor@1#1",
    )
    assert report.restarts == 0, "a lost executor must not fail the query"
    assert _executors_killed(tmp_path) == 2


@pytest.mark.slow  # 29 s; the default suite loses an executor once per task point
def test_executor_killed_twice(cluster_spark: ClusterSpark, tmp_path: Path) -> None:
    """Partition 1's task loses its executor on two attempts (spark.task.maxFailures=2).

    Usually the job fails, the query stops and the runner restarts it. But when the killed
    executor also held the epoch's shuffle output (one map task, placed by the scheduler),
    Spark resubmits the stage, whose new attempt counts task failures afresh, and absorbs the
    second kill too. Both paths must end exactly once.
    """
    report = run_on_cluster(
        cluster_spark, tmp_path, "after_precommit:kill-executor@1#1*2", epochs=2
    )
    assert report.restarts in (0, 1), report.exit_codes
    if report.restarts:
        assert report.exit_codes[0] == 1  # the driver survived and reported the failed query


def test_driver_killed_on_the_cluster(cluster_spark: ClusterSpark, tmp_path: Path) -> None:
    """The driver SIGKILLed after the decision and in the middle of commit."""
    report = run_on_cluster(
        cluster_spark,
        tmp_path,
        "after_decision:kill-driver@0,during_commit:kill-driver@1",
        epochs=2,
    )
    assert report.restarts == 2
    assert report.exit_codes[:2] == [-9, -9]


# -- the fuller matrix: --run-slow --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("point", ["before_precommit", "after_precommit"])
@pytest.mark.parametrize("times", [1, 2, 3])
def test_kill_executor_matrix(
    cluster_spark: ClusterSpark, tmp_path: Path, point: str, times: int
) -> None:
    report = run_on_cluster(cluster_spark, tmp_path, f"{point}:kill-executor@1#1*{times}")
    # Two or more kills usually fail the query once; see test_executor_killed_twice.
    assert report.restarts <= (0 if times == 1 else 1), report.exit_codes


@pytest.mark.slow
def test_kill_driver_at_every_point_on_the_cluster(
    cluster_spark: ClusterSpark, tmp_path: Path
) -> None:
    from tests.streaming import EVERY_POINT_ONCE

    report = run_on_cluster(cluster_spark, tmp_path, EVERY_POINT_ONCE, epochs=6, max_runs=12)
    assert report.restarts == 7


@pytest.mark.slow
def test_executor_and_driver_kills_mixed(cluster_spark: ClusterSpark, tmp_path: Path) -> None:
    report = run_on_cluster(
        cluster_spark,
        tmp_path,
        "before_precommit:kill-executor@0#0,after_precommit:kill-executor@1#1*2,"
        "after_decision:kill-driver@2,after_precommit:kill-executor@3#0,"
        "during_commit:kill-driver@3",
        epochs=4,
    )
    assert report.restarts in (2, 3), report.exit_codes  # 2 driver kills (+1, see above)


# -- single-pass epochs (Kafka's direct mode): one barrier stage, votes to the driver -----


def run_single_pass_on_cluster(
    cs: ClusterSpark,
    request: pytest.FixtureRequest,
    workdir: Path,
    connector: str,
    variant: str,
    plan: str,
    *,
    epochs: int = 3,
    max_runs: int = 8,
    lines: list[str] | None = None,
) -> tuple[ChaosReport, dict[int, EpochState]]:
    """Run a fresh target of ``connector``'s single-pass ``variant`` on the cluster under
    ``plan``, read back by its verifier (Kafka: ``read_committed``, no transaction left
    open); the report and the log's epochs. ``lines``: gets what the drivers printed."""
    env: dict[str, str] = {}
    for service in services_for(request, [connector]).values():
        env.update(service.env())
    options = dict(adapters()[connector].variants[variant])
    (target,) = new_targets([connector], workdir, tag="cl", env=env, options={connector: options})
    request.addfinalizer(lambda: target.adapter.drop_target(target.spec, target.env))
    log = str(workdir / "txlog")
    report = _run_chaos_on_cluster(
        cs,
        workdir,
        plan,
        sinks=[target.spec],
        verifiers={connector: target.verifier(range(ROWS_PER_EPOCH * epochs), log=log)},
        env=target.child_env(),
        epochs=epochs,
        max_runs=max_runs,
        lines=lines,
    )
    verdict = report.verdicts[connector]
    assert (verdict.duplicates, verdict.missing, verdict.lingering) == (0, 0, 0), verdict
    return report, {s.epoch: s for s in open_log(log).states()}


def _decided_round(state: EpochState) -> int:
    assert state.decision is not None, state
    return state.decision.round


@pytest.mark.parametrize(("connector", "variant"), variant_params(single_pass=True))
def test_single_pass_executor_killed_before_and_after_the_decision(
    cluster_spark: ClusterSpark,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    connector: str,
    variant: str,
) -> None:
    """Partition 1's executor SIGKILLed in epoch 0 after its pre-commit (before it voted),
    and in epoch 1 when its task was told to commit (after the decision).

    Epoch 0: the barrier stage fails before the decision; the coordinator voids round 0
    and runs the epoch again in round 1 (Spark never retries a failed barrier result
    stage). Epoch 1: partition 0 committed its own transaction; partition 1's shard is
    committed from Spark's replay of the epoch in the same micro-batch, checked against
    the decided count and checksum. No restart.

    The vote service is reachable from the executors at the driver's address
    (``spark.driver.host``): every epoch is decided only once every task voted, and
    ``before_task_commit`` fires in a task only after the driver's answer came back, in an
    executor (kill-executor finds the executor JVM above its task, or refuses to fire).
    """
    lines: list[str] = []
    report, states = run_single_pass_on_cluster(
        cluster_spark,
        request,
        tmp_path,
        connector,
        variant,
        "after_precommit:kill-executor@0#1,before_task_commit:kill-executor@1#1",
        lines=lines,
    )
    assert report.restarts == 0, report.exit_codes
    assert any("after the decision" in line and "replay" in line for line in lines), lines
    assert _executors_killed(tmp_path) == 2
    assert (states[0].voided, _decided_round(states[0])) == ((0,), 1)
    for epoch in (1, 2):  # epoch 1 decided before the kill; 2 without a fault
        assert (states[epoch].rounds, _decided_round(states[epoch])) == ((0,), 0)
    for state in states.values():
        assert state.decision is not None
        assert [len(hs) for hs in state.decision.handles.values()] == [2], "one per partition"


#: The fuller single-pass matrix on the cluster (--run-slow): (plan, restarts).
SINGLE_PASS_PLANS = {
    # Killed while writing, before its pre-commit: a new round, as above.
    "before-precommit": ("before_precommit:kill-executor@1#1", 0),
    # Killed in rounds 0 and 1 before the decision: Spark's retries (maxFailures=2) are
    # used up, the epoch fails, the restarted query runs it in round 2.
    "after-precommit-twice": ("after_precommit:kill-executor@1#1*2", 1),
    # Both executors killed after the decision, each task told to commit: no task commits,
    # the replay (on the executors started again) commits every shard.
    "before-task-commit-every-task": ("before_task_commit:kill-executor@1*2", 0),
    # The driver killed after the decision (its tasks get no answer: they abort): the next
    # run's recovery commits epoch 0 from the replay; then epoch 1 as in the default test.
    "after-decision-driver-then-executor": (
        "after_decision:kill-driver@0,before_task_commit:kill-executor@1#1",
        1,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SINGLE_PASS_PLANS))
@pytest.mark.parametrize(("connector", "variant"), variant_params(single_pass=True))
def test_single_pass_kill_matrix(
    cluster_spark: ClusterSpark,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    connector: str,
    variant: str,
    case: str,
) -> None:
    plan, restarts = SINGLE_PASS_PLANS[case]
    report, states = run_single_pass_on_cluster(
        cluster_spark, request, tmp_path, connector, variant, plan
    )
    assert report.restarts == restarts, report.exit_codes
    assert all(s.decision is not None for s in states.values())
