"""Chaos on a Spark standalone cluster: executor JVMs and drivers SIGKILLed, files sink.

The cluster profile (markers ``cluster`` and ``chaos``): ``integration/cluster.py`` starts a
master and two workers (separate JVMs) once per session; every query runs in a child process
(``python -m txsink.runner txsink.testing.pipelines:run_stream``) with ``master=spark://...``,
restarted after each crash. The child processes keep the cluster's driver apart from the
shared local SparkSession of the root conftest (one SparkSession per Python process).

Each run is judged by reading the files sink back through its manifests: zero duplicates,
zero missing, zero lingering staged files, every epoch committed and nothing pending.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster import Cluster, ClusterError, start_cluster, submit_args

from txsink.connectors.files.testing import FilesVerifier, verify_files
from txsink.log import open_log
from txsink.testing import run_chaos
from txsink.testing.chaos import ChaosReport
from txsink.testing.inputs import make_input

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
    make_input(workdir / "input", rows, epochs)
    lines: list[str] = []
    report = run_chaos(
        PIPELINE,
        plan,
        workdir=workdir,
        args={
            "workdir": str(workdir),
            "sinks": [{"kind": "files", "path": str(workdir / "output")}],
            "master": cs.master,
        },
        sinks_verifiers={"files": FilesVerifier(workdir / "output", range(rows))},
        env=cs.env,
        max_runs=max_runs,
        timeout=300,
        on_progress=lines.append,
    )
    context = report.table() + "\n" + "\n".join(lines[-40:])
    assert report.finished, context
    assert len(report.faults_fired) == report.faults_planned, "a fault never fired\n" + context
    report.assert_ok()
    verdict = verify_files(workdir / "output", range(rows))
    assert (verdict.duplicates, verdict.missing, verdict.unexpected, verdict.lingering) == (
        0,
        0,
        0,
        0,
    ), verdict
    assert verdict.epochs == epochs, verdict
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
