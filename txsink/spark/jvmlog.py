"""Spark's log4j records that repeat a txsink error, denied from the user's process.

A txsink error that ends a query is told by txsink first, as one paragraph
(:mod:`txsink.observe.failure`). Spark's driver logs it again, whole, in records whose text holds
the Python traceback inside a JVM trace:

1. ``Query … [id = …, runId = …] terminated with error`` (``MicroBatchExecution``), with
   the exception that ended the query run;
2. when one of txsink's tasks raised (a :class:`~txsink.errors.RetryableError` Spark
   retries, say): ``Exception in task …`` (``Executor``, in local mode the driver's JVM),
   ``Lost task …`` (``TaskSetManager``, for each failed or killed attempt) and
   ``Task … failed N times; aborting job``.

On the Data Source path txsink's code runs in Python workers of Spark's, which cannot
reach the driver's log configuration; in a classic ``foreachBatch`` it runs in the user's
process, but the records are written by the JVM's threads. The records' *messages* name
only the query or the task; txsink's error is in their exception (1, ``Exception in
task``) or deep in the message (``Lost task``), which log4j's own filters do not tell
apart from any other failure.

So :func:`deny_told_records` (called from the user's process: ``register(spark)``, and
each ``foreachBatch`` call of a coordinator, :func:`told_once`) adds to the log4j
configuration that governs those loggers a filter written in Python (a py4j callback, as
``foreachBatch`` is). A ``RegexFilter`` lets every other record through in the JVM; only
these few reach Python, which denies:

- record 1 when its exception carries txsink's note (:func:`txsink.observe.failure.mark`) saying
  the paragraph was printed on this driver's console;
- the task records when their text carries a task's note (:mod:`txsink.protocol.taskerror`) and
  txsink's console prints errors here (the coordinator tells the job's failure, or its
  retry of the epoch, in one line). An attempt Spark runs again gets one WARNING line of
  txsink's instead of its trace.

A query ending for any other reason, a task failing with another error, or a paragraph
nobody saw, is logged as before. Classic PySpark only: under Spark Connect the driver is
the server, whose log is its own. ``TXSINK_TRACEBACK=full`` turns it off. The filter is
removed when the Python process exits (a py4j callback to a process gone would fail
inside Spark's logging).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

from txsink.errors import TASK_ERROR_MARKER
from txsink.observe.failure import ended_by_failure, excepthook, full_traceback, last_note
from txsink.observe.logs import console_prints, get_logger

__all__ = ["GOVERNED_LOGGERS", "Decision", "denies", "deny_told_records", "told_once"]

#: The loggers whose records repeat a txsink error (Spark 4.1 moved the stream execution
#: into ``runtime``; both names are looked up).
GOVERNED_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.MicroBatchExecution",
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.util.Utils",
    "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask",
)
#: The records that may reach Python; a ``RegexFilter`` (whole message, Java) lets the
#: rest through. Spark 4.1 prefixes a streaming task's records with ``[queryId = …]``.
_CANDIDATES = (
    r"(?s).*Query .*terminated with error"
    r"|.*Exception in task \S+ in stage .*"
    r"|.*Lost task \S+ in stage .*"
    r"|.*Task \d+ in stage \S+ failed \d+ times; aborting job.*"
    r"|Aborting task|Abort(?:ing|ed) commit for partition .*"
)
_LOST = re.compile(r"Lost task (\d+)\.(\d+) in stage (\S+) \(TID")
_ABORTING = re.compile(
    r"Task \d+ in stage (\S+) failed \d+ times; aborting job"
    r"|Abort(?:ing|ed) commit for partition \d+ \(task \d+, attempt \d+, stage (\S+)\)"
)
#: A task's stage, in an executor's record or in the name of the thread that wrote it.
_STAGE = re.compile(r"in stage (\S+) \(TID")
_MAX_CAUSES = 20
_MAX_STAGES = 1000
_SETTLE_TICKS = 50  # x 0.1 s
_log = get_logger("txsink.spark")

_lock = threading.Lock()
#: The py4j gateways (one per driver JVM) whose log4j configuration has the filter.
_installed: set[int] = set()


def denies(texts: list[str]) -> bool:
    """Whether a query's end whose exception reads ``texts`` is a txsink failure told
    already: the last note :func:`txsink.observe.failure.mark` left says it was printed."""
    doc = last_note(texts)
    return doc is not None and doc.get("printed") is True


def _told_by_the_hook(texts: list[str]) -> bool:
    """A query's end on a failed txsink task that no coordinator told (the Data Source
    path): told by this process's hook (:func:`txsink.observe.failure.excepthook`) when the
    exception ends it, and its task records were denied here."""
    return (
        last_note(texts) is None
        and any(TASK_ERROR_MARKER in t for t in texts)
        and sys.excepthook is excepthook
        and console_prints(logging.ERROR)
    )


class Decision:
    """What the filter decides for one record's message and exception texts; keeps the
    stages whose task failures it denied (their ``aborting job`` line goes too)."""

    def __init__(self, max_failures: int) -> None:
        self.max_failures = max_failures
        self.stages: list[str] = []

    def deny(self, message: str, thrown: list[str], thread: str = "") -> bool:
        if message.rstrip().endswith("terminated with error"):
            return denies(thrown) or _told_by_the_hook(thrown)
        aborting = _ABORTING.search(message)
        if aborting is not None:
            return (aborting[1] or aborting[2]) in self.stages
        if not any(TASK_ERROR_MARKER in t for t in (message, *thrown)):
            return False
        if not console_prints(logging.ERROR):  # nobody would see txsink's line
            return False
        stage = _STAGE.search(message) or _STAGE.search(thread)
        if stage is not None:
            self._remember(stage[1])
        lost = _LOST.search(message)
        if lost is not None:
            attempt = int(lost[2])
            if "TaskKilled" not in message and attempt + 1 < self.max_failures:
                self._retried(message, int(lost[1]), attempt)
        return True

    def _remember(self, stage: str) -> None:
        if stage not in self.stages:
            self.stages.append(stage)
            del self.stages[:-_MAX_STAGES]

    def _retried(self, message: str, task: int, attempt: int) -> None:
        from txsink.protocol.taskerror import carried

        err = carried(RuntimeError(message))
        if err is None:
            return
        _log.bind(uid=err.sink_uid, epoch=err.epoch).warning(
            "task %d (attempt %d of %d) failed, Spark runs it again: %s: %s",
            task,
            attempt + 1,
            self.max_failures,
            type(err).__name__,
            " ".join(str(err).split()),
        )


class _TxsinkRecords:
    """A log4j 2 ``Filter`` implemented in Python: DENY what :class:`Decision` denies,
    NEUTRAL for anything else. Every method must return, never raise: an exception here
    would escape Spark's logging call on a query's or the scheduler's thread."""

    def __init__(self, result: Any, state: Any, decision: Decision) -> None:
        self._result = result
        self._state = state
        self._decision = decision

    def filter(self, *args: Any) -> Any:  # every overload of Filter.filter
        with contextlib.suppress(Exception):  # a record it cannot read is logged
            if len(args) == 1:  # filter(LogEvent): what a LoggerConfig calls
                event = args[0]
                message = str(event.getMessage().getFormattedMessage())
                thread = str(event.getThreadName() or "")
                if self._decision.deny(message, _texts(event.getThrown()), thread):
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
        return "txsink: deny Spark's records that repeat a txsink error told already"

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


@contextlib.contextmanager
def told_once(df: Any) -> Iterator[None]:
    """Around a classic ``foreachBatch`` call: the filter is in place before its tasks
    run (:func:`deny_told_records`, once per driver JVM)."""
    with contextlib.suppress(Exception):  # a Connect DataFrame, a session gone
        deny_told_records(df.sparkSession)
    yield


def deny_told_records(spark: Any) -> bool:
    """Add the filter (once per driver JVM) to the log4j configuration of ``spark``'s
    driver. Returns whether it is in place; never raises."""
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
            added = _install(gateway, jvm, Decision(_max_failures(sc)))
        except Exception:  # no log4j 2, no callback server: Spark logs as it does
            return False
        _installed.add(id(gateway))
    atexit.register(_remove, gateway, added, sc)
    return True


_LOCAL = re.compile(r"local(?:\[\s*(?:\d+|\*)\s*(?:,\s*(\d+)\s*)?\])?")


def _max_failures(sc: Any) -> int:
    """How many times Spark runs a task before it fails the job: ``local[N,F]`` says F,
    ``local`` / ``local[N]`` 1, a cluster ``spark.task.maxFailures`` (4)."""
    master = str(sc.master or "")
    local = _LOCAL.fullmatch(master)
    if local is not None:
        return int(local[1] or 1)
    return int(sc.getConf().get("spark.task.maxFailures", "4"))


def _install(gateway: Any, jvm: Any, decision: Decision) -> list[tuple[Any, Any]]:
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]
    core = jvm.org.apache.logging.log4j.core
    result = getattr(core, "Filter$Result")
    state = getattr(core, "LifeCycle$State")
    # Only the candidate records reach Python: the RegexFilter accepts (ends the chain
    # for) every other record in the JVM.
    regex = core.filter.RegexFilter.createFilter(
        _CANDIDATES, None, False, result.NEUTRAL, result.ACCEPT
    )
    first = gateway.new_array(core.Filter, 1)
    first[0] = regex
    # A Python object crosses as an argument of a call (not as an array element).
    chain = core.filter.CompositeFilter.createFilters(first).addFilter(
        _TxsinkRecords(result, state, decision)
    )
    config = jvm.org.apache.logging.log4j.LogManager.getContext(False).getConfiguration()
    added: list[tuple[Any, Any]] = []
    names: set[str] = set()
    for logger in GOVERNED_LOGGERS:
        governing = config.getLoggerConfig(logger)
        name = str(governing.getName())
        if name in names:
            continue
        names.add(name)
        governing.addFilter(chain)
        added.append((governing, chain))
    return added


def _remove(gateway: Any, added: list[tuple[Any, Any]], sc: Any) -> None:
    """At exit: take the filter out while the py4j callback can still answer. When a
    txsink failure ends the process, first let the tasks Spark is killing (the failed
    stage's others) end, so that their records are still filtered (a few seconds at most:
    past that the exit goes on)."""
    if ended_by_failure():
        with contextlib.suppress(Exception):  # a SparkContext stopped: nothing runs
            tracker = sc._jsc.sc().statusTracker()
            for _ in range(_SETTLE_TICKS):
                if sum(e.numRunningTasks() for e in tracker.getExecutorInfos()) == 0:
                    break
                time.sleep(0.1)
    with _lock:
        _installed.discard(id(gateway))
    for governing, chain in added:
        with contextlib.suppress(Exception):  # the JVM gone first: nothing logs any more
            governing.removeFilter(chain)
