"""How the coordinator turns a Spark DataFrame into one epoch of the protocol: the layout
of its partitions (``coalesce`` to ``max_tasks``, a sink's required partitioning), the
plan check of a replayed source, and which job runs the pre-commit (the partition tasks,
the single pass for sinks that commit in their tasks, or the tasks over persisted rows
for sinks whose commit reads the rows again).

A mixin of :class:`txsink.Coordinator`, kept apart so the protocol's module holds the
epoch's steps and not the Spark glue around them (:meth:`run_epoch` never sees a
DataFrame).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from txsink.contract import EpochData, SinkContract
from txsink.observe.logs import EpochLogger
from txsink.protocol.epochresult import EpochResult
from txsink.protocol.log import TxLog
from txsink.protocol.recovery import Recovery
from txsink.protocol.task import precommit_job
from txsink.spark import jobs as _spark
from txsink.spark import layout as _layout
from txsink.spark import stability as _stability

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SparkEpochMixin"]


class SparkEpochMixin:
    """:meth:`_run_spark_epoch`: one epoch over a DataFrame, for ``foreachBatch`` and
    :meth:`~txsink.Coordinator.write`."""

    log: TxLog
    sinks: tuple[SinkContract[Any, Any], ...]
    max_tasks: int | Literal["slots"] | None
    _recovery: Recovery
    _log: EpochLogger
    _probe_votes: bool

    if TYPE_CHECKING:  # the protocol's own entry point (txsink.coordinator)

        def run_epoch(
            self,
            epoch: int,
            precommit: Any,
            *,
            app_id: str,
            data: EpochData | None = None,
            replay: bool = True,
        ) -> EpochResult: ...

    def _run_spark_epoch(
        self, epoch: int, df: DataFrame, app_id: str, *, replay: bool = True
    ) -> EpochResult:
        # Commits spread over the cluster (and recovery's) run as this session's tasks.
        self._recovery.tasks = _spark.SparkTaskRunner(df.sparkSession)
        wanted = [s.required_partitioning() for s in self.sinks]
        data = _layout.laid_out(df, wanted, self.max_tasks)
        _stability.check_replayed(data, self.sinks, self.log)  # once per query run
        in_task = [s.uid for s in self.sinks if s.commits_in_task]
        if in_task:
            log, uids = self._log.bind(epoch=epoch), "+".join(in_task)
            probe, tasks = self._probe_votes, self._recovery.tasks
            job = _spark.single_pass_job(df, data, uids, tasks, probe=probe, log=log)
            self._probe_votes = False
            return self.run_epoch(epoch, job, app_id=app_id, data=job.data, replay=replay)
        if not any(s.commits_from_data for s in self.sinks):
            each = precommit_job(_spark.SparkEpochData(data))
            return self.run_epoch(epoch, each, app_id=app_id, replay=replay)
        # The commit reads the rows again: keep this epoch's rows instead of
        # recomputing them (a recomputation after a crash is what the checksums catch).
        data = data.persist()
        try:
            rows = _spark.SparkEpochData(data)
            return self.run_epoch(
                epoch, precommit_job(rows), app_id=app_id, data=rows, replay=replay
            )
        finally:
            data.unpersist()
