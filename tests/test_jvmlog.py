"""Spark's ``terminated with error`` record of a query a txsink error ended, denied from the
user's process (:mod:`txsink._jvmlog`): the rules without Spark, then the real log4j
configuration of the test session's driver deciding on real log events.
The whole run (``python job.py`` through ``format("txsink")``) is in
integration/test_one_paragraph.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from txsink import _jvmlog
from txsink._failure import MARKER, TRACEBACK_ENV


def _note(printed: bool) -> str:
    doc = {"type": "EpochAbortedError", "paragraph": "[pg epoch 1] it failed", "printed": printed}
    return MARKER + json.dumps(doc)


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


class _Event:
    def __init__(self, thrown: _Thrown | None) -> None:
        self.thrown = thrown

    def getThrown(self) -> _Thrown | None:
        if isinstance(self.thrown, _Thrown) and self.thrown.text == "gone":
            raise RuntimeError("the JVM went away")
        return self.thrown


def test_the_filter_reads_the_exception_and_its_causes_and_never_raises() -> None:
    f = _jvmlog._MarkedTermination(_Result, _State)
    wrapped = _Thrown("StreamingQueryException: x", _Thrown(_spark_text(_note(printed=True))))
    assert f.filter(_Event(wrapped)) == "DENY"
    assert f.filter(_Event(_Thrown("java.io.IOException: disk full"))) == "NEUTRAL"
    assert f.filter(_Event(None)) == "NEUTRAL"
    assert f.filter(_Event(_Thrown("gone"))) == "NEUTRAL"
    # The overloads a context-wide filter gets (logger, level, marker, message, ...).
    assert f.filter(None, "ERROR", None, "Query terminated with error", wrapped) == "NEUTRAL"
    assert f.getState() == "STARTED" and f.isStarted() and not f.isStopped()


@pytest.mark.spark
def test_the_drivers_log4j_denies_only_the_told_termination(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    assert _jvmlog.deny_marked_terminations(spark)
    assert _jvmlog.deny_marked_terminations(spark)  # once per driver JVM
    jvm = spark.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    config = log4j.LogManager.getContext(False).getConfiguration()
    logger = next(n for n in _jvmlog.TERMINATION_LOGGERS if jvm.java.lang.Class.forName(n))

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
    ended = "Query [id = 6c1f, runId = 9e2a] terminated with error"
    assert filtered(ended, wrapped)
    assert filtered("Query named [id = 6c1f, runId = 9e2a] terminated with error", told)
    assert not filtered(ended, jvm.org.apache.spark.SparkException(_spark_text(_note(False))))
    assert not filtered(ended, jvm.java.lang.IllegalStateException("the source's failure"))
    assert not filtered("Data source write support … is aborting.", told)


def test_it_stays_off_with_full_tracebacks_or_without_a_driver_jvm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Connect:  # a Spark Connect session: no SparkContext on the client
        @property
        def sparkContext(self) -> Any:
            raise RuntimeError("[JVM_ATTRIBUTE_NOT_SUPPORTED]")

    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    assert not _jvmlog.deny_marked_terminations(Connect())
    monkeypatch.setenv(TRACEBACK_ENV, "full")
    assert not _jvmlog.deny_marked_terminations(Connect())
