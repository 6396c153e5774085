"""``df.writeStream.format("txsink")``: txsink as a PySpark Python Data Source.

One format for every connector, chosen by the ``connector`` option, so the core never
names one and a third-party connector works as soon as it is installed::

    spark.dataSource.register(TxsinkDataSource)       # or automatic: see pyspark_txsink
    (df.writeStream.format("txsink")
       .option("connector", "files").option("path", "/data/out").option("uid", "out")
       .option("log", "/data/txsink-log").option("checkpointLocation", "/data/ckpt")
       .start())

The other options are the sink's constructor parameters (:mod:`txsink.datasource.options`). The
protocol is the coordinator's (:mod:`txsink.datasource.epoch`): planning recovers and picks the
round, the tasks prepare (:func:`txsink.protocol.task.run_partition`), ``commit`` decides and
commits, ``abort`` voids. One sink per query; cross-system atomicity stays with
``foreachBatch(Coordinator([...]))``.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from txsink.datasource import epoch as _dsepoch
from txsink.datasource.options import DsConfig, parse_options, redacted
from txsink.errors import ConfigurationError
from txsink.observe.failure import install_excepthook
from txsink.observe.logs import failures_logged, get_logger, install_console
from txsink.protocol.faults import FaultPlan
from txsink.protocol.task import Ack, TaskPlan, run_partition
from txsink.protocol.taskerror import mark
from txsink.spark.jvmlog import deny_told_records

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "FORMAT",
    "TxsinkCommitMessage",
    "TxsinkDataSource",
    "error_text",
    "format_not_found",
    "register",
]

#: The format name: ``df.writeStream.format("txsink")``.
FORMAT = "txsink"
#: Spark's local properties a streaming batch's tasks see (MicroBatchExecution sets them).
_BATCH_ID = "streaming.sql.batchId"
_QUERY_ID = "sql.streaming.queryId"


_ERROR_LINE = re.compile(r"^txsink\.errors\.(\w+): (.*)$", re.MULTILINE)


def error_text(err: BaseException) -> str | None:
    """The txsink error inside a failed query's exception, as ``Type: message``.

    A Data Source's failures reach the user's process as the Python traceback's text inside
    Spark's exception (``PYTHON_DATA_SOURCE_ERROR``, a task failure); this finds its txsink
    error line. ``None`` if there is none."""
    found = _ERROR_LINE.findall(str(err))
    return f"{found[-1][0]}: {found[-1][1]}" if found else None


#: Spark's error condition for a format no installed or registered source provides.
_NOT_FOUND = "DATA_SOURCE_NOT_FOUND"


def format_not_found(err: BaseException) -> ConfigurationError | None:
    """The fix, as a :class:`ConfigurationError`, when ``err`` (or an exception it came
    from) is Spark's ``DATA_SOURCE_NOT_FOUND`` for the ``txsink`` format; else ``None``.

    Read from Spark's structured error (condition and ``provider`` parameter: PySpark's
    own exceptions, and the Java ``SparkThrowable`` inside a ``Py4JJavaError``), never
    from the message text."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for source in (current, getattr(current, "java_exception", None)):
            condition, provider = _spark_condition(source)
            if condition == _NOT_FOUND and provider.lower() == FORMAT:
                return ConfigurationError(
                    "Spark found no data source named 'txsink' (DATA_SOURCE_NOT_FOUND): "
                    "PySpark registers it by itself only where txsink is pip-installed in "
                    "the Python that Spark's Python workers run (PYSPARK_PYTHON); call "
                    "txsink.datasource.register(spark) once after creating the session "
                    "(docs/datasource.md#registration)",
                    phase="check",
                )
        current = current.__cause__ or current.__context__
    return None


def _spark_condition(source: object) -> tuple[str | None, str]:
    """(error condition, ``provider`` parameter) of a Spark error, Python or Java side."""
    if source is None:
        return None, ""
    try:
        condition = source.getCondition()  # type: ignore[attr-defined]
        params = source.getMessageParameters()  # type: ignore[attr-defined]
        return (str(condition) if condition else None), str(dict(params or {}).get("provider", ""))
    except Exception:  # not a Spark error (py4j answers any name, then fails the call)
        return None, ""


def register(spark: SparkSession) -> None:
    """Register the ``txsink`` format with ``spark`` (needed only where the automatic
    registration of installed ``pyspark_*`` modules is off or not supported). A query of
    this process that a txsink error stops ends with one paragraph, not Spark's traceback
    (:mod:`txsink.observe.failure`), and without Spark's log4j record of its end repeating the
    error (:mod:`txsink.spark.jvmlog`)."""
    spark.dataSource.register(TxsinkDataSource)
    install_console()  # a task's retry, told in one line here (txsink.spark.jvmlog)
    install_excepthook()
    deny_told_records(spark)


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


class _StreamWriter(DataSourceStreamArrowWriter):
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
    return TxsinkCommitMessage(app_id, setup.round, acks, started, time.time())


def _arrow(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)
