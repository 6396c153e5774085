"""The ``txsink`` format's classes: the Python Data Source, its stream and batch writers,
and one task's write (Spark 4.0+ only: :mod:`txsink.datasource` imports this module when
the format is first used, after :func:`txsink.spark.versions.require_data_source`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    WriterCommitMessage,
)

from txsink.datasource import epoch as _dsepoch
from txsink.datasource.options import DsConfig, parse_options, redacted
from txsink.errors import ConfigurationError
from txsink.observe.logs import failures_logged, get_logger
from txsink.protocol.faults import FaultPlan
from txsink.protocol.task import Ack, TaskPlan, run_partition
from txsink.protocol.taskerror import mark
from txsink.spark import versions as _versions
from txsink.spark.jobs import settle_worker_heap

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
    from pyspark.sql.types import StructType
else:  # 4.1+'s class; a stand-in on 4.0, where streamWriter refuses first
    _StreamWriterBase = _versions.stream_writer_base()

__all__ = ["FORMAT", "TxsinkCommitMessage", "TxsinkDataSource"]

#: The format name: ``df.writeStream.format("txsink")``.
FORMAT = "txsink"
#: Spark's local properties a streaming batch's tasks see (MicroBatchExecution sets them).
_BATCH_ID = "streaming.sql.batchId"
_QUERY_ID = "sql.streaming.queryId"


@dataclass
class TxsinkCommitMessage(WriterCommitMessage):
    """A task's pre-commit acks, the app it wrote as and its round, for ``commit``; with the
    wall-clock times its pre-commit started and ended (``time.time()``), since the commit,
    in another process, cannot time the tasks itself."""

    app_id: str | None
    round: int
    acks: list[Ack]
    started: float | None = None
    finished: float | None = None


class TxsinkDataSource(DataSource):
    """The ``txsink`` format: streaming and static writes through any registered connector."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        # Built here, not unpickled: Spark's planning worker builds the source it asks for a
        # stream writer; the commit worker unpickles one (no planning there). Not pickled.
        self._built_here = True

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_built_here", None)
        return state

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _config(self) -> DsConfig:
        return parse_options(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> _BatchWriter:
        """Static ``df.write.format("txsink")``: one epoch (the next, or option ``epoch``)."""
        config = self._checked(overwrite)
        with failures_logged(get_logger(__name__, uid=config.sink.uid), epoch=config.epoch):
            _, setup = _dsepoch.plan_tasks(config, _arrow(schema), streaming=False)
        return _BatchWriter(config, setup)

    def streamWriter(self, schema: StructType, overwrite: bool) -> _StreamWriter:
        """Streaming: in the planning worker (a source built there), plan before the batch's
        tasks (recovery, the round), so that a refusal is raised here, as Spark's planning
        error. Spark also calls this before ``commit`` / ``abort`` (on a source it
        unpickled), which need no planning."""
        _versions.require_stream_data_source()
        config = self._checked(overwrite)
        writer = _StreamWriter(config, _arrow(schema))
        if getattr(self, "_built_here", False):
            writer.plan()
        return writer

    def _checked(self, overwrite: bool) -> DsConfig:
        with failures_logged(get_logger(__name__)):
            config = self._config()
        if overwrite:
            raise ConfigurationError(
                "format('txsink') appends exactly once; it cannot overwrite or truncate: use "
                "mode('append') (static writes) or outputMode('append')",
                sink_uid=config.sink.uid,
                connector=config.connector,
                phase="check",
            )
        return config

    def __repr__(self) -> str:
        return f"TxsinkDataSource(options={redacted(self.options)})"


class _StreamWriter(_StreamWriterBase):
    """Streaming writes. Created by Spark in the planning worker, planned there (then
    pickled to the tasks), and again in the commit worker, unplanned."""

    def __init__(self, config: DsConfig, schema: pa.Schema) -> None:
        self.config = config
        self.schema = schema
        self.setup: _dsepoch.TaskSetup | None = None

    def plan(self) -> None:
        """Recovery and the round, once (:func:`txsink.datasource.epoch.plan_tasks`)."""
        if self.setup is None:
            with failures_logged(get_logger(__name__, uid=self.config.sink.uid)):
                _, self.setup = _dsepoch.plan_tasks(self.config, self.schema, streaming=True)

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to the tasks planned: a PySpark that would unpickle the source in its
        # planning worker (no plan in streamWriter) gets it planned here, as before.
        self.plan()
        return self.__dict__.copy()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxsinkCommitMessage:
        if self.setup is None:
            raise ConfigurationError("the txsink writer reached a task without its planning")
        return _write_task(self.config, self.setup, iterator)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        with failures_logged(get_logger(__name__, uid=self.config.sink.uid), epoch=batchId):
            _dsepoch.commit_epoch(self.config, batchId, _round(messages), messages)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        round_ = _round(messages)
        if round_ is not None:
            _dsepoch.abort_epoch(self.config, batchId, round_, messages)


class _BatchWriter(DataSourceArrowWriter):
    """Static writes: planned once (in :meth:`TxsinkDataSource.writer`); this same object,
    pickled, runs the tasks and then ``commit`` / ``abort``."""

    def __init__(self, config: DsConfig, setup: _dsepoch.TaskSetup) -> None:
        self.config = config
        self.setup = setup

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxsinkCommitMessage:
        return _write_task(self.config, self.setup, iterator)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        epoch = self.setup.epoch
        with failures_logged(get_logger(__name__, uid=self.config.sink.uid), epoch=epoch):
            if epoch is None:  # pragma: no cover - writer() always sets it
                raise ConfigurationError("a static txsink write without its epoch")
            _dsepoch.commit_epoch(self.config, epoch, self.setup.round, messages, static=True)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        if self.setup.epoch is not None:
            _dsepoch.abort_epoch(self.config, self.setup.epoch, self.setup.round, messages)


def _round(messages: Sequence[WriterCommitMessage | None]) -> int | None:
    rounds = {m.round for m in messages if isinstance(m, TxsinkCommitMessage)}
    if len(rounds) > 1:
        raise ConfigurationError(f"the tasks of one batch wrote under rounds {sorted(rounds)}")
    return rounds.pop() if rounds else None


def _write_task(
    config: DsConfig, setup: _dsepoch.TaskSetup, batches: Iterator[pa.RecordBatch]
) -> TxsinkCommitMessage:
    """One task: write and prepare its partition as the coordinator's tasks do."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise ConfigurationError("the txsink writer ran outside a Spark task")
    epoch = setup.epoch
    if epoch is None:
        epoch = int(ctx.getLocalProperty(_BATCH_ID) or -1)
    app_id = setup.app_id or ctx.getLocalProperty(_QUERY_ID)
    if epoch < 0 or not app_id:
        raise ConfigurationError(
            "format('txsink') streaming tasks see no batch id or query id: run it as a "
            "micro-batch streaming query (continuous trigger is not supported)",
            sink_uid=config.sink.uid,
            connector=config.connector,
        )
    if setup.committed_through is not None and epoch <= setup.committed_through:
        return TxsinkCommitMessage(app_id, setup.round, [])  # a replay: commit skips it
    plan = TaskPlan(
        app_id,
        epoch,
        setup.round,
        (config.sink,),
        FaultPlan.from_env(),
        _dsepoch.driver_pid() or 0,
        socket.gethostname(),
    )
    started = time.time()
    try:
        acks = run_partition(plan, ctx.partitionId(), ctx.taskAttemptId(), batches)
    except Exception as err:  # Spark retries the task; the note names it on the driver
        raise mark(err, sink_uid=config.sink.uid, partition=ctx.partitionId()) from err.__cause__
    settle_worker_heap()
    return TxsinkCommitMessage(app_id, setup.round, acks, started, time.time())


def _arrow(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)
