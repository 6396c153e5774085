"""Spark's log4j record of a query that a txsink error ended, denied from the user's process.

When a query ends on an error, Spark's driver logs ``Query … [id = …, runId = …] terminated
with error`` at ERROR with the whole exception: for a txsink error, the JVM trace with the
Python traceback inside, the error told again below txsink's paragraph. On the Data Source
path (``writeStream.format("txsink")``) txsink's code runs in Python workers of Spark's,
which cannot reach the driver's log configuration; only the user's process can (py4j), and
it runs no txsink code between the failure and the record. The record's *message* names
only the query; the txsink error is in its *throwable*, which log4j's own filters
(``RegexFilter``, ``StringMatchFilter``) do not read.

So :func:`deny_marked_terminations`, called from the user's process (``register(spark)``),
adds to the log4j configuration that governs Spark's stream execution a filter written in
Python (a py4j callback, as ``foreachBatch`` is): a ``RegexFilter`` lets every record whose
message is not ``Query … terminated with error`` through in the JVM, and only those few
records reach Python, which denies the one whose exception carries txsink's note
(:func:`txsink._failure.mark`) *and* whose paragraph was printed on this driver's console.
A query ending for any other reason, or a paragraph nobody saw, is logged as before.

Classic PySpark only: under Spark Connect the driver is the server, whose log is its own.
``TXSINK_TRACEBACK=full`` turns it off. The filter is removed when the Python process exits
(a py4j callback to a process gone would fail inside Spark's logging).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from typing import Any, ClassVar

from txsink._failure import full_traceback, last_note

__all__ = ["TERMINATION_LOGGERS", "denies", "deny_marked_terminations"]

#: The stream execution's logger names (Spark 4.1 moved the class into ``runtime``).
TERMINATION_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.MicroBatchExecution",
)
#: Spark's message for a query run's end on an error (``StreamExecution.runStream``).
_TERMINATED = r"Query .*terminated with error"
_MAX_CAUSES = 20

_lock = threading.Lock()
#: The py4j gateways (one per driver JVM) whose log4j configuration has the filter.
_installed: set[int] = set()


def denies(texts: list[str]) -> bool:
    """Whether a record whose exception reads ``texts`` is a txsink failure told already:
    the last note :func:`txsink._failure.mark` left says its paragraph was printed."""
    doc = last_note(texts)
    return doc is not None and doc.get("printed") is True


class _MarkedTermination:
    """A log4j 2 ``Filter`` implemented in Python: DENY a record whose throwable carries a
    printed txsink paragraph, NEUTRAL for anything else. Every method must return, never
    raise: an exception here would escape Spark's ``logError`` on the query's thread."""

    def __init__(self, result: Any, state: Any) -> None:
        self._result = result
        self._state = state

    def filter(self, *args: Any) -> Any:  # every overload of Filter.filter
        with contextlib.suppress(Exception):  # a record it cannot read is logged
            if len(args) == 1:  # filter(LogEvent): what a LoggerConfig calls
                thrown = args[0].getThrown()
                if thrown is not None and denies(_texts(thrown)):
                    return self._result.DENY
        return self._result.NEUTRAL

    def getOnMatch(self) -> Any:
        return self._result.DENY

    def getOnMismatch(self) -> Any:
        return self._result.NEUTRAL

    def getState(self) -> Any:
        return self._state.STARTED

    def initialize(self) -> None:
        return None

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def isStarted(self) -> bool:
        return True

    def isStopped(self) -> bool:
        return False

    def toString(self) -> str:
        return "txsink: deny a query's termination record that carries a told txsink error"

    class Java:
        implements: ClassVar[list[str]] = ["org.apache.logging.log4j.core.Filter"]


def _texts(thrown: Any) -> list[str]:
    texts = []
    current = thrown
    for _ in range(_MAX_CAUSES):
        if current is None:
            break
        texts.append(str(current.toString()))
        current = current.getCause()
    return texts


def deny_marked_terminations(spark: Any) -> bool:
    """Add the filter (once per driver JVM) to the log4j configuration of ``spark``'s
    driver, so a query that a txsink error ends is not logged again inside Spark's
    ``terminated with error`` record. Returns whether it is in place; never raises."""
    if full_traceback():
        return False
    try:
        sc = spark.sparkContext  # raises under Spark Connect: no driver JVM here
        gateway = sc._gateway
        jvm = sc._jvm
    except Exception:
        return False
    if gateway is None or jvm is None:
        return False
    with _lock:
        if id(gateway) in _installed:
            return True
        try:
            added = _install(gateway, jvm)
        except Exception:  # no log4j 2, no callback server: Spark logs as it does
            return False
        _installed.add(id(gateway))
    atexit.register(_remove, gateway, added)
    return True


def _install(gateway: Any, jvm: Any) -> list[tuple[Any, Any]]:
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]
    core = jvm.org.apache.logging.log4j.core
    result = getattr(core, "Filter$Result")
    state = getattr(core, "LifeCycle$State")
    # Only the stream execution's termination records reach Python: the RegexFilter
    # accepts (ends the chain for) every other record in the JVM.
    regex = core.filter.RegexFilter.createFilter(
        _TERMINATED, None, False, result.NEUTRAL, result.ACCEPT
    )
    first = gateway.new_array(core.Filter, 1)
    first[0] = regex
    # A Python object crosses as an argument of a call (not as an array element).
    chain = core.filter.CompositeFilter.createFilters(first).addFilter(
        _MarkedTermination(result, state)
    )
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    added: list[tuple[Any, Any]] = []
    names: set[str] = set()
    for logger in TERMINATION_LOGGERS:
        governing = config.getLoggerConfig(logger)
        name = str(governing.getName())
        if name in names:
            continue
        names.add(name)
        governing.addFilter(chain)
        added.append((governing, chain))
    return added


def _remove(gateway: Any, added: list[tuple[Any, Any]]) -> None:
    """At exit: take the filter out while the py4j callback can still answer."""
    with _lock:
        _installed.discard(id(gateway))
    for governing, chain in added:
        with contextlib.suppress(Exception):  # the JVM gone first: nothing logs any more
            governing.removeFilter(chain)
