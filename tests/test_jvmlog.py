"""Spark's log4j records that repeat a txsink error told already, denied from the user's
process (:mod:`txsink.spark.jvmlog`): the query's ``terminated with error`` record and a failed
task's records. The rules without Spark, then the real log4j configuration of the test
session's driver deciding on real log events. The whole runs (``python job.py``) are in
integration/test_one_paragraph.py.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

from txsink.errors import RetryableError
from txsink.observe.failure import MARKER, TRACEBACK_ENV, excepthook
from txsink.observe.logs import configure_logging
from txsink.protocol.taskerror import mark
from txsink.spark import jvmlog as _jvmlog


def _note(printed: bool) -> str:
    doc = {"type": "EpochAbortedError", "paragraph": "[pg epoch 1] it failed", "printed": printed}
    return MARKER + json.dumps(doc)


_ENDED = "Query [id = 6c1f, runId = 9e2a] terminated with error"


def _spark_text(note: str) -> str:
    """What the record's exception reads: Spark's wrapper, the Python traceback, the note."""
    return (
        "org.apache.spark.SparkException: [PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed "
        "when Python streaming data source perform commit: Traceback (most recent call last):\n"
        '  File "datasource.py", line 154, in commit\n'
        "txsink.errors.EpochAbortedError: [sink_uid=pg, epoch=1] it failed\n"
        f"{note}\n SQLSTATE: 38000"
    )


def test_only_a_txsink_error_whose_paragraph_was_printed_is_denied() -> None:
    assert _jvmlog.denies([_spark_text(_note(printed=True))])
    # Nobody saw the paragraph (txsink's console off): Spark's record is all there is.
    assert not _jvmlog.denies([_spark_text(_note(printed=False))])
    assert not _jvmlog.denies(["java.lang.IllegalStateException: the source's own failure"])
    # The last note wins: a txsink error wrapping an older, printed one was not printed.
    assert not _jvmlog.denies([_note(printed=True), _note(printed=False)])


class _Result:
    DENY = "DENY"
    NEUTRAL = "NEUTRAL"


class _State:
    STARTED = "STARTED"


class _Thrown:
    def __init__(self, text: str, cause: _Thrown | None = None) -> None:
        self.text = text
        self.cause = cause

    def toString(self) -> str:
        return self.text

    def getCause(self) -> _Thrown | None:
        return self.cause


class _Message:
    def __init__(self, text: str) -> None:
        self.text = text

    def getFormattedMessage(self) -> str:
        return self.text


class _Event:
    def __init__(self, thrown: _Thrown | None, message: str = _ENDED) -> None:
        self.thrown = thrown
        self.message = message

    def getMessage(self) -> _Message:
        return _Message(self.message)

    def getThreadName(self) -> str:
        return "stream execution thread for [id = 6c1f, runId = 9e2a]"

    def getThrown(self) -> _Thrown | None:
        if isinstance(self.thrown, _Thrown) and self.thrown.text == "gone":
            raise RuntimeError("the JVM went away")
        return self.thrown


def test_the_filter_reads_the_exception_and_its_causes_and_never_raises() -> None:
    f = _jvmlog._TxsinkRecords(_Result, _State, _jvmlog.Decision(1))
    wrapped = _Thrown("StreamingQueryException: x", _Thrown(_spark_text(_note(printed=True))))
    assert f.filter(_Event(wrapped)) == "DENY"
    assert f.filter(_Event(_Thrown("java.io.IOException: disk full"))) == "NEUTRAL"
    assert f.filter(_Event(None)) == "NEUTRAL"
    assert f.filter(_Event(_Thrown("gone"))) == "NEUTRAL"
    # The overloads a context-wide filter gets (logger, level, marker, message, ...).
    assert f.filter(None, "ERROR", None, "Query terminated with error", wrapped) == "NEUTRAL"
    assert f.getState() == "STARTED" and f.isStarted() and not f.isStopped()


def _task_failure() -> str:
    """What Spark's records of a failed txsink task read: the task's traceback, its note."""
    err = RetryableError(
        "cannot connect to PostgreSQL at host=db: Connection refused",
        sink_uid="pg",
        epoch=1,
        partition=0,
        phase="begin",
        connector="postgres",
    )
    try:
        raise mark(err)
    except RetryableError as raised:
        trace = "".join(traceback.format_exception(raised))
    return (
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was "
        f"thrown from the Python worker: {trace} SQLSTATE: 38000"
    )


def _lost(task: str, stage: str = "3.0", how: str = "") -> str:
    return (
        f"[queryId = 4c1da] [batchId = 1] Lost task {task} in stage {stage} (TID 7) "
        f"(192.0.2.2 executor driver): {how}{_task_failure()}"
    )


@pytest.fixture
def console() -> Iterator[None]:
    logging.getLogger("txsink").handlers.clear()
    configure_logging("info")  # txsink's console handler, on stderr
    yield
    logging.getLogger("txsink").handlers.clear()


def test_a_failed_tasks_records_are_denied_and_a_retried_attempt_is_one_line(
    console: None, capsys: pytest.CaptureFixture[str]
) -> None:
    once = _jvmlog.Decision(max_failures=1)  # local[2]: the first failure fails the job
    assert once.deny("Exception in task 0.0 in stage 3.0 (TID 7)", [_task_failure()])
    assert once.deny(_lost("0.0"), [])
    assert once.deny("[queryId = 4c1da] Task 0 in stage 3.0 failed 1 times; aborting job", [])
    assert once.deny(_lost("1.0", how="TaskKilled (Stage cancelled: "), [])
    assert capsys.readouterr().err == ""  # the coordinator's paragraph tells it
    # Another stage's end, another task error, another failure: Spark's records.
    assert not once.deny("Task 0 in stage 4.0 failed 1 times; aborting job", [])
    assert not once.deny("Lost task 0.0 in stage 4.0 (TID 9) (h executor 1): OOM", [])
    assert not once.deny("Exception in task 0.0 in stage 4.0 (TID 9)", ["java.io.IOException"])

    retried = _jvmlog.Decision(max_failures=2)  # local[2,2]: one more attempt
    assert retried.deny(_lost("0.0"), [])
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "txsink: WARNING [pg epoch 1] task 0 (attempt 1 of 2) failed, Spark runs it again: "
        "RetryableError: [sink_uid=pg, epoch=1, partition=0, phase=begin, connector=postgres] "
        "cannot connect to PostgreSQL at host=db: Connection refused"
    )
    assert retried.deny(_lost("0.1"), [])  # the last attempt: the paragraph follows
    assert capsys.readouterr().err == ""


def test_a_data_source_tasks_records_and_the_queries_end_go_when_the_hook_tells_it(
    console: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``format("txsink")`` no coordinator tells a failed task: the executor's
    ``Aborting task`` (its stage in the thread's name) and ``Aborting commit`` lines go,
    and the query's end goes when this process's hook will print the task's error."""
    decision = _jvmlog.Decision(max_failures=1)
    worker = "Executor task launch worker for task 1.0 in stage 5.0 (TID 4)"
    assert decision.deny("Aborting task", [_task_failure()], worker)
    assert decision.deny("Aborting commit for partition 1 (task 4, attempt 0, stage 5.0)", [])
    assert decision.deny("Aborted commit for partition 1 (task 4, attempt 0, stage 5.0)", [])
    assert not decision.deny("Aborting commit for partition 1 (task 9, attempt 0, stage 6.0)", [])
    ended = [_task_failure()]
    monkeypatch.setattr("sys.excepthook", sys.__excepthook__)
    assert not decision.deny(_ENDED, ended)  # no hook of txsink's: Spark's record stays
    monkeypatch.setattr("sys.excepthook", excepthook)
    assert decision.deny(_ENDED, ended)
    assert not decision.deny(_ENDED, ["java.lang.IllegalStateException: the source"])


def test_task_records_stay_when_txsinks_console_is_off(console: None) -> None:
    configure_logging("off")
    assert not _jvmlog.Decision(max_failures=1).deny(_lost("0.0"), [])


@pytest.mark.spark
def test_the_drivers_log4j_denies_only_the_told_termination(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    assert _jvmlog.deny_told_records(spark)
    assert _jvmlog.deny_told_records(spark)  # once per driver JVM
    jvm = spark.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    config = log4j.LogManager.getContext(False).getConfiguration()
    logger = next(n for n in _jvmlog.GOVERNED_LOGGERS if _has_class(jvm, n))

    def filtered(message: str, thrown: Any) -> bool:
        event = (
            log4j.core.impl.Log4jLogEvent.newBuilder()
            .setLoggerName(logger)
            .setLevel(log4j.Level.ERROR)
            .setMessage(log4j.message.SimpleMessage(message))
            .setThrown(thrown)
            .build()
        )
        return bool(config.getLoggerConfig(logger).isFiltered(event))

    told = jvm.org.apache.spark.SparkException(_spark_text(_note(printed=True)))
    wrapped = jvm.java.lang.RuntimeException("StreamingQueryException", told)
    ended = _ENDED
    assert filtered(ended, wrapped)
    assert filtered("Query named [id = 6c1f, runId = 9e2a] terminated with error", told)
    assert not filtered(ended, jvm.org.apache.spark.SparkException(_spark_text(_note(False))))
    assert not filtered(ended, jvm.java.lang.IllegalStateException("the source's failure"))
    assert not filtered("Data source write support … is aborting.", told)
    # A failed task's records (the console of this process prints txsink's errors).
    logging.getLogger("txsink").handlers.clear()
    configure_logging("info")
    try:
        lost = _lost("0.0", stage="9999.0")
        assert filtered(lost, None)
        assert filtered("Task 0 in stage 9999.0 failed 1 times; aborting job", None)
        assert filtered(
            "Exception in task 0.0 in stage 9999.0 (TID 7)",
            jvm.org.apache.spark.SparkException(_task_failure()),
        )
        assert not filtered("Lost task 0.0 in stage 9998.0 (TID 8) (h executor 1): OOM", None)
    finally:
        logging.getLogger("txsink").handlers.clear()


def test_it_stays_off_with_full_tracebacks_or_without_a_driver_jvm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Connect:  # a Spark Connect session: no SparkContext on the client
        @property
        def sparkContext(self) -> Any:
            raise RuntimeError("[JVM_ATTRIBUTE_NOT_SUPPORTED]")

    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    assert not _jvmlog.deny_told_records(Connect())
    monkeypatch.setenv(TRACEBACK_ENV, "full")
    assert not _jvmlog.deny_told_records(Connect())


def _has_class(jvm: Any, name: str) -> bool:
    """Whether the driver's JVM has class ``name`` (Spark 4 moved the streaming executions
    to ``...streaming.runtime``; 3.5 has them one package up)."""
    try:
        jvm.java.lang.Class.forName(name)
    except Exception:
        return False
    return True
