"""The Spark side of a coordinator's epochs: one interface between a DataFrame and the
protocol.

:class:`SparkEpochs` is everything ``foreachBatch(df, batch_id)`` and ``write(df)`` do
before the protocol runs, and the one place that turns a DataFrame into what the
protocol takes: the query's checks (its id, its mode, the lease's renewal while it runs),
the schema check of its first batch, the layout of its partitions (``coalesce`` to
``max_tasks``, a sink's required partitioning), the plan check of a replayed source, and
which job runs the pre-commit (the partition tasks, the single pass for sinks that commit
in their tasks, or the tasks over persisted rows for sinks whose commit reads the rows
again). Then :meth:`~txsink.protocol.epoch.EpochProtocol.run_epoch` runs the steps; it
never sees a DataFrame.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from txsink.protocol.epoch import EpochProtocol, EpochResult
from txsink.protocol.lease import until_the_query_runs
from txsink.protocol.task import precommit_job
from txsink.spark import jobs as _spark
from txsink.spark import jvmlog as _jvmlog
from txsink.spark import layout as _layout
from txsink.spark import stability as _stability
from txsink.spark.checks import arrow_schema, check_sinks, no_app_error
from txsink.spark.query import identify, is_connect

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["SparkEpochs"]


class SparkEpochs:
    """Epochs over DataFrames, for one :class:`~txsink.protocol.epoch.EpochProtocol`.

    Holds what the Spark side learns in one process (the queries it checked, the schema
    it checked, whether the single pass's vote service was probed this run); none of it
    travels to another process (:meth:`__getstate__`).
    """

    def __init__(self, protocol: EpochProtocol, max_tasks: _layout.MaxTasks) -> None:
        _layout.check_max_tasks(max_tasks, protocol.sinks)
        self.protocol = protocol
        self.max_tasks = _layout.resolve_max_tasks(max_tasks, protocol.sinks)
        wanted = (s.required_partitioning() for s in protocol.sinks)
        #: The partitioning the sinks need (refused here if they disagree).
        self.partitioning = _layout.required_partitioning(wanted)
        self.checked_queries: set[str] = set()
        self.checked_schema: pa.Schema | None = None
        self.probe_votes = True  # single pass: executors reach the driver? once per run

    def __getstate__(self) -> dict[str, Any]:
        """Travelling (Spark Connect): the receiving process checks its queries again."""
        run: dict[str, Any] = {
            "checked_queries": set(),
            "checked_schema": None,
            "probe_votes": True,
        }
        return {**self.__dict__, **run}

    def foreach_batch(self, df: DataFrame, epoch: int) -> EpochResult:
        """``foreachBatch``: the query's checks (once per query run), then the epoch."""
        protocol = self.protocol
        with _jvmlog.told_once(df):  # not again in Spark's log
            query = identify(df, self.checked_queries)
            app_id = protocol.app_id or query.query_id
            if app_id is None:
                raise no_app_error(connect=query.connect)
            if query.new_run and query.query_id is not None:
                self.checked_queries.add(query.query_id)
                # The query can't be watched: renewed while the process lives; under Spark
                # Connect this process is the server's worker: renewed at each epoch.
                watch = None if query.connect else until_the_query_runs
                protocol.start_run(app_id, query.trigger_s, query.active or watch)
                self.probe_votes = True
            protocol.bind(app_id)  # the log's own checks come before the sinks'
            self.check_schema(df, app_id)
            return self.run(epoch, df, app_id, connect=query.connect)

    def write(self, df: DataFrame, epoch: int | None, app_id: str) -> EpochResult:
        """A static DataFrame as one epoch (the next one when ``epoch`` is None)."""
        protocol = self.protocol
        protocol.bind(app_id)  # the log's own checks come before the sinks'
        self.check_schema(df, app_id)
        epoch = protocol.begin_write(app_id, epoch)
        return self.run(epoch, df, app_id, connect=is_connect(df), replay=False)

    def check_schema(self, df: DataFrame, app_id: str, *, again: bool = False) -> None:
        """The sinks' checks (:func:`~txsink.spark.checks.check_sinks`), again only when
        the epoch's schema changed (or ``again``: recovery changed the targets); the schema
        changes they plan go to the protocol, for the epoch's decision."""
        schema = arrow_schema(df)
        self.protocol.rows_schema = schema  # recorded in the decision, for the audit
        if not again and self.checked_schema is not None and schema.equals(self.checked_schema):
            return
        self.checked_schema = None  # until the checks passed
        protocol = self.protocol
        plan = check_sinks(protocol.sinks, schema, app_id, self.partitioning, log=protocol.log)
        protocol.schema_plan = plan
        self.checked_schema = schema

    def run(
        self, epoch: int, df: DataFrame, app_id: str, *, connect: bool, replay: bool = True
    ) -> EpochResult:
        """Lay the epoch out, pick its pre-commit job, and run the protocol's steps
        (``connect``: ``df`` is a Spark Connect DataFrame)."""
        protocol = self.protocol
        sinks = protocol.sinks

        def replan() -> None:  # recovery changed the targets: compare their schemas again
            self.check_schema(df, app_id, again=True)

        data = _layout.laid_out(df, self.partitioning, self.max_tasks)
        in_task = "+".join(s.uid for s in sinks if s.commits_in_task)
        log = protocol.epoch_logger(epoch)
        parts = _layout.check_single_pass(data, in_task, connect, log=log) if in_task else 0
        _stability.check_replayed(data, sinks, protocol.log)  # once per query run
        # Commits spread over the cluster (and recovery's) run as this session's tasks.
        tasks = _spark.SparkTaskRunner(df.sparkSession)
        if in_task:
            job = _spark.single_pass_job(df, data, parts, in_task, tasks, probe=self.probe_votes)
            self.probe_votes = False
            protocol.use_tasks(tasks)
            return protocol.run_epoch(
                epoch, job, app_id=app_id, data=job.data, replay=replay, replan=replan
            )
        # A commit that reads the rows again keeps this epoch's rows instead of recomputing
        # them (a recomputation after a crash is what the checksums catch).
        again = any(s.commits_from_data for s in sinks)
        if again:
            data = data.persist()
        try:
            rows = _spark.SparkEpochData(data)
            protocol.use_tasks(tasks)
            return protocol.run_epoch(
                epoch, precommit_job(rows), app_id=app_id, data=rows if again else None,
                replay=replay, replan=replan,
            )  # fmt: skip
        finally:
            if again:
                data.unpersist()
