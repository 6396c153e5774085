"""Single-pass epochs (sinks that commit in their tasks), on every variant that has them.

What the crash matrix does not cover: the epoch refused before any row is written when the
cluster cannot run its tasks at once; a failure after the decision whose replay is not the
same (refused, nothing partial, then finished by a deterministic replay); a restart with
another partition count, before and after a decision. Read back by the connector's
verifier: zero duplicates, zero missing, nothing lingering.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import variant_params, variant_target
from tests.streaming import prepare_input, run_until_done, start_query
from txsink import Coordinator
from txsink.errors import ConfigurationError
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import open_log
from txsink.testing.targets import RunTarget
from txsink.testing.verifiers import verify

ROWS = 1000


def _target(request: pytest.FixtureRequest, tmp: Path, connector: str, variant: str) -> RunTarget:
    return variant_target(request, tmp, connector, variant, tag="sp")


def _one_partition(df: Any) -> Any:
    """The restarts' transform: the stream in one partition (the decided runs had 2)."""
    return df.repartition(1)


def _fails_with(query: Any, match: str) -> None:
    with pytest.raises(Exception, match=match):
        query.awaitTermination()


@pytest.mark.spark
@pytest.mark.parametrize(("connector", "variant"), variant_params(single_pass=True))
def test_more_partitions_than_task_slots_is_refused_before_any_row(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Path, connector: str, variant: str
) -> None:
    target = _target(request, tmp_path, connector, variant)
    coordinator = Coordinator([target.sink()], log=str(tmp_path / "txlog"), app_id="sp-slots")
    df = spark.range(0, 100, 1, 5).selectExpr("id", "cast(id as string) as key")
    with pytest.raises(ConfigurationError, match=r"5 partitions.*2 tasks at once.*repartition"):
        coordinator.write(df, epoch=0)
    verdict = verify(target.verifier(range(0), log=str(tmp_path / "txlog")))
    assert verdict.ok, verdict
    assert open_log(str(tmp_path / "txlog")).states() == []


@pytest.mark.spark
@pytest.mark.parametrize(("connector", "variant"), variant_params(single_pass=True))
def test_a_restart_with_another_partition_count(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Path, connector: str, variant: str
) -> None:
    """Epoch 1 fails before its decision with 2 partitions per epoch; the restart runs with
    1 (the slots allow no more): exactly-once. Epoch 2 fails after its decision; the
    restart, with 1 partition again, commits it from the replay (the same shard)."""
    target = _target(request, tmp_path, connector, variant)
    prepare_input(tmp_path, ROWS)
    log = str(tmp_path / "txlog")
    plan = FaultPlan.parse("before_decision:raise@1,after_decision:raise@2", str(tmp_path / "f"))

    _fails_with(
        start_query(spark, tmp_path, Coordinator([target.sink()], log=log, faults=plan)),
        "InjectedFault",
    )
    restarts, _ = run_until_done(
        spark,
        tmp_path,
        lambda: Coordinator([target.sink()], log=log, faults=plan),
        transform=_one_partition,
    )
    assert restarts == 1  # the after_decision fault at epoch 2
    assert len(plan.fired()) == 2
    verdict = verify(target.verifier(range(ROWS), log=log))
    assert verdict.ok, verdict
    assert [s.status for s in open_log(log).states()].count("committed") == 4


@pytest.mark.spark
@pytest.mark.parametrize(("connector", "variant"), variant_params(single_pass=True))
def test_a_different_replay_after_the_decision_is_refused_then_finished(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Path, connector: str, variant: str
) -> None:
    """The driver fails after deciding epoch 1 (2 partitions); the restart's replay has 1,
    so its shards are not the decided ones: refused, nothing of it written; the next
    restart, partitioned as decided, finishes it exactly once."""
    target = _target(request, tmp_path, connector, variant)
    prepare_input(tmp_path, ROWS)
    log = str(tmp_path / "txlog")
    plan = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "f"))

    _fails_with(
        start_query(spark, tmp_path, Coordinator([target.sink()], log=log, faults=plan)),
        "InjectedFault",
    )
    replay = Coordinator([target.sink()], log=log)
    _fails_with(
        start_query(spark, tmp_path, replay, transform=_one_partition),
        "NonDeterministicReplayError",
    )
    assert [s.status for s in open_log(log).states()] == ["committed", "decided"]
    restarts, _ = run_until_done(spark, tmp_path, lambda: Coordinator([target.sink()], log=log))
    assert restarts == 0
    verdict = verify(target.verifier(range(ROWS), log=log))
    assert verdict.ok, verdict
