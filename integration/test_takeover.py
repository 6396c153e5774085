"""Zombie drivers and rescaled restarts on real targets (Kafka WAL + Postgres + S3; the
zombies also with Kafka's direct mode, a single-pass epoch).

**Zombie**: driver A stops in the middle of epoch 1 (a long GC pause, a frozen VM, a
network partition) while a supervisor, believing it dead, starts driver B on the same
checkpoint and txsink log. B recovers and runs the query to its end; then A wakes up and
carries on where it stopped. Whatever A does after that must change nothing: either it
can no longer decide (B voided its round, :class:`~txsink.errors.FencedError`), or what it
commits was already committed by B (every commit is idempotent). A's query then fails;
the targets hold every row exactly once and nothing lingers.

A is a query in the test's Spark session paused by a :class:`PointHooks` hook; the hook's
callback runs B to completion as a child process before it lets A go on. In a single-pass
epoch A's driver-side points are in its vote service's thread, while A's tasks wait for
their answer with their transactions open; ``before_task_commit`` holds one of A's tasks
after it was told to commit. B's start fences those transactions (Kafka: a new producer
on each transactional id), so whatever A's tasks commit afterwards fails.

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cross import FILES, ROWS, Cross, observed

from conftest import server_connectors, services_for
from tests.streaming import prepare_input, run_until_done, start_query
from txsink.protocol.faults import FaultPlan
from txsink.testing.adapter import adapters
from txsink.testing.hooks import PointHooks
from txsink.testing.observer import input_epochs

pytestmark = [pytest.mark.chaos, pytest.mark.kafka, pytest.mark.postgres, pytest.mark.s3]

PIPELINE = "txsink.testing.pipelines:run_stream"

#: Where A stops, and how B's takeover must end A's query (see _zombie).
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


#: The same in a single-pass epoch, where the sinks that commit in their tasks (Kafka's direct
#: mode) hold their transactions open in A's tasks from the pre-commit to their own commit:
#: (how B's takeover ends A's query, the partition whose task A is held in).
SINGLE_PASS_ZOMBIE_POINTS: dict[str, tuple[str, int | None]] = {
    # In A's vote service, every task waiting for its answer with its transaction open: B's
    # start fences the in-task transactions (aborted), B voids A's round and writes epoch 1
    # again; A's decision is refused and its tasks are answered "abort".
    "before_decision": ("FencedError", None),
    # A decided (from its vote service's thread), its tasks still wait for the answer with
    # their transactions open: B's start fences them (aborted), B's recovery commits A's
    # decision from its replay. Then A answers "commit": its tasks' commits fail (fenced),
    # and its step 5 finds every shard committed already.
    "after_decision": ("CONCURRENT_STREAM_LOG_UPDATE", None),
    # A's task of partition 1 was told to commit; partition 0 committed its shard. B commits
    # the rest of A's decision (partition 1's shard from its replay; the other sinks); A's
    # task's commit then fails (fenced), and A's step 5 has nothing left to do.
    "before_task_commit": ("CONCURRENT_STREAM_LOG_UPDATE", 1),
    # A's tasks committed their shards and A committed the first other unit: B the rest.
    "during_commit": ("CONCURRENT_STREAM_LOG_UPDATE", None),
}
#: The single-pass zombie of the default suite (the others with --run-slow).
SINGLE_PASS_QUICK = {"after_decision"}


@pytest.fixture
def cross_single_pass(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cross]:
    """The ``cross`` targets, with each connector's single-pass variant where it has one."""
    options = {
        name: dict(found.variants[min(found.single_pass_variants)])
        for name, found in adapters().items()
        if found.single_pass_variants
    }
    assert options, "no connector has a single-pass variant"
    connectors = server_connectors()
    made = Cross.create(connectors, services_for(request, connectors), tmp_path, options)
    yield made
    made.drop()


def _run_driver_b(cross: Cross, partitions: int = 2) -> subprocess.CompletedProcess[str]:
    """Driver B: the same query (checkpoint, log, sinks) in a new process, to its end.

    The supervisor believes A dead, so it breaks A's driver lease first, as
    ``txsink recover --break-lease`` does (A lives on in this process and renews it: B
    would refuse to start otherwise, which is the lease's job); A's next renewal finds the
    lease lost."""
    from txsink.protocol.lease import LeaseKeeper
    from txsink.protocol.log import open_log

    breaker = LeaseKeeper(open_log(cross.log), 60.0, by="operator")
    breaker.hold(force=True)
    breaker.release()
    args = {"workdir": str(cross.tmp), "sinks": cross.specs(), "partitions": partitions}
    return subprocess.run(
        [sys.executable, "-m", "txsink.runner", PIPELINE, json.dumps(args)],
        env=dict(os.environ, **cross.child_env()),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _zombie(spark: Any, cross: Cross, point: str, ending: str, partition: int | None) -> None:
    """Driver A held at ``point`` of epoch 1 while driver B runs the query to its end; then
    A goes on. ``ending``: ``"FencedError"``, what A's coordinator must raise; anything
    else, A's coordinator returns (its commits change nothing) and Spark's error ends A's
    query. The targets hold every row once."""
    from pyspark.errors import StreamingQueryException

    prepare_input(cross.tmp, ROWS, FILES)
    hooks = PointHooks(cross.tmp / "hooks")
    takeover: list[subprocess.CompletedProcess[str]] = []
    hooks.at(point, lambda: takeover.append(_run_driver_b(cross)), epoch=1, partition=partition)
    failure: list[BaseException] = []
    raised: list[Exception] = []  # what A's coordinator raised, as itself (not Spark's text)

    def run() -> None:
        coordinator = cross.coordinator(hooks.plan(wait_s=600))

        def epoch(df: Any, batch_id: int) -> None:
            try:
                coordinator(df, batch_id)
            except Exception as err:
                raised.append(err)
                raise

        with hooks:
            query = start_query(spark, cross.tmp, epoch)
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
    if ending == "FencedError":
        assert [type(e).__name__ for e in raised] == [ending], raised
    else:
        assert raised == [], f"the zombie's coordinator failed: {raised}"
        assert ending in str(failure[0]), failure[0]
    cross.assert_exactly_once(ROWS, report)


@pytest.mark.spark
@pytest.mark.parametrize(
    "point",
    # during_commit ends as after_decision does (B's recovery commits A's decision): slow
    [p if p != "during_commit" else pytest.param(p, marks=pytest.mark.slow) for p in ZOMBIE_POINTS],
)
def test_stale_driver_resumed_after_a_takeover_changes_nothing(
    spark: Any, cross: Cross, point: str
) -> None:
    _zombie(spark, cross, point, ZOMBIE_POINTS[point], None)


@pytest.mark.spark
@pytest.mark.parametrize(
    "point",
    [
        pytest.param(p, marks=[] if p in SINGLE_PASS_QUICK else [pytest.mark.slow])
        for p in SINGLE_PASS_ZOMBIE_POINTS
    ],
)
def test_stale_single_pass_driver_resumed_after_a_takeover_changes_nothing(
    spark: Any, cross_single_pass: Cross, point: str
) -> None:
    """The same with every connector's single-pass variant (Kafka's direct mode): A's
    tasks hold their transactions open, or are told to commit them, while B runs."""
    ending, partition = SINGLE_PASS_ZOMBIE_POINTS[point]
    _zombie(spark, cross_single_pass, point, ending, partition)


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
                spark, cross.tmp, cross.coordinator, transform=lambda df: df.repartition(3, "id")
            )[0]
        )

    report = observed(cross, run, expected=input_epochs(cross.tmp / "input"))
    print(f"\n[rescale 2->3 at {point}] {report.table()}")
    assert plan.fired(), "the fault never fired"
    cross.assert_exactly_once(ROWS, report)
