"""Zombie drivers and rescaled restarts on real targets (Kafka WAL + Postgres + S3).

**Zombie**: driver A stops in the middle of epoch 1 (a long GC pause, a frozen VM, a
network partition) while a supervisor, believing it dead, starts driver B on the same
checkpoint and txsink log. B recovers and runs the query to its end; then A wakes up and
carries on where it stopped. Whatever A does after that must change nothing: either it
can no longer decide (B voided its round, :class:`~txsink.errors.FencedError`), or what it
commits was already committed by B (every commit is idempotent). A's query then fails;
the targets hold every row exactly once and nothing lingers.

A is a query in the test's Spark session paused by a :class:`PointHooks` hook; the hook's
callback runs B to completion as a child process before it lets A go on.

**Rescale**: the query crashes with 2 Spark partitions and restarts with 3 (``repartition``
stands for any change of ``spark.sql.shuffle.partitions`` or of the source's partitions).
Recovery commits exactly the decided epoch's handles, whatever the new layout; an epoch
that was only prepared is aborted and written again with 3 partitions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from cross import FILES, ROWS, Cross, observed

from tests.streaming import prepare_input, run_until_done, start_query
from txsink.faults import FaultPlan
from txsink.testing.hooks import PointHooks
from txsink.testing.observer import input_epochs

pytestmark = [pytest.mark.chaos, pytest.mark.kafka, pytest.mark.postgres, pytest.mark.s3]

PIPELINE = "txsink.testing.pipelines:run_stream"

#: Where A stops, and how B's takeover must end A's query.
ZOMBIE_POINTS: dict[str, str] = {
    # A prepared epoch 1; B voids A's round, aborts its transactions and writes epoch 1
    # again: A's decision is refused.
    "before_decision": "FencedError",
    # A decided epoch 1; B's recovery commits A's decision: A's own commits are no-ops,
    # and Spark refuses A's second commit of batch 1 to the checkpoint.
    "after_decision": "CONCURRENT_STREAM_LOG_UPDATE",
    # A committed one handle; B commits the rest: the same as above.
    "during_commit": "CONCURRENT_STREAM_LOG_UPDATE",
}


def _run_driver_b(cross: Cross, partitions: int = 2) -> subprocess.CompletedProcess[str]:
    """Driver B: the same query (checkpoint, log, sinks) in a new process, to its end."""
    args = {"workdir": str(cross.tmp), "sinks": cross.specs(), "partitions": partitions}
    return subprocess.run(
        [sys.executable, "-m", "txsink.runner", PIPELINE, json.dumps(args)],
        env=dict(os.environ, **cross.child_env()),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.spark
@pytest.mark.parametrize("point", list(ZOMBIE_POINTS))
def test_stale_driver_resumed_after_a_takeover_changes_nothing(
    spark: Any, cross: Cross, point: str
) -> None:
    from pyspark.errors import StreamingQueryException

    prepare_input(cross.tmp, ROWS, FILES)
    hooks = PointHooks(cross.tmp / "hooks")
    takeover: list[subprocess.CompletedProcess[str]] = []
    hooks.at(point, lambda: takeover.append(_run_driver_b(cross)), epoch=1)
    failure: list[BaseException] = []

    def run() -> None:
        with hooks:
            query = start_query(spark, cross.tmp, cross.coordinator(hooks.plan(wait_s=600)))
            try:
                query.awaitTermination()
            except StreamingQueryException as err:
                failure.append(err)

    report = observed(cross, run, expected=input_epochs(cross.tmp / "input"))
    print(f"\n[zombie at {point}] {report.table()}")
    assert not hooks.errors, hooks.errors
    assert takeover, "driver A never reached the point; driver B never ran"
    b = takeover[0]
    assert b.returncode == 0, f"driver B failed:\n{b.stdout[-3000:]}\n{b.stderr[-3000:]}"
    assert failure, "the zombie's query finished as if nothing had happened"
    assert ZOMBIE_POINTS[point] in str(failure[0]), failure[0]
    cross.assert_exactly_once(ROWS, report)


@pytest.mark.spark
@pytest.mark.parametrize("point", ["after_precommit", "before_decision", "after_decision"])
def test_restart_with_another_partition_count(spark: Any, cross: Cross, point: str) -> None:
    """Crash at ``point`` of epoch 1 with 2 partitions; restart with 3 (tasks: partition 1)."""
    prepare_input(cross.tmp, ROWS, FILES)
    # A task fault fires twice: Spark retries a failed task once (local[2,2]).
    spec = f"{point}:raise@1" + ("#1*2" if point == "after_precommit" else "")
    plan = FaultPlan.parse(spec, str(cross.tmp / "faults"))
    restarts: list[int] = []

    def run() -> None:
        from pyspark.errors import StreamingQueryException

        query = start_query(spark, cross.tmp, cross.coordinator(plan))
        with pytest.raises(StreamingQueryException, match="InjectedFault"):
            query.awaitTermination()
        restarts.append(
            run_until_done(
                spark, cross.tmp, cross.coordinator, transform=lambda df: df.repartition(3)
            )[0]
        )

    report = observed(cross, run, expected=input_epochs(cross.tmp / "input"))
    print(f"\n[rescale 2->3 at {point}] {report.table()}")
    assert plan.fired(), "the fault never fired"
    cross.assert_exactly_once(ROWS, report)
