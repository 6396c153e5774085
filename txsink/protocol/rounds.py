"""Riding out a short target outage: an epoch's pre-commit runs again in new rounds, and
its commit step is tried again, for up to ``Coordinator(outage_s=)`` seconds.

Before the decision nothing of the epoch is visible, so a round that failed is voided
(it can never be decided) and its transactions are aborted; after a pause a new round
writes the epoch from its start. Nothing is held open between rounds, so no transaction
timeout runs meanwhile. After the decision, a sink's share is committed again
(``commit_epoch`` is idempotent: "already committed" is success, verified).

What is tried again is a *transient* failure (:func:`transient`): a
:class:`~txsink.errors.RetryableError`, raised on the driver or by a Spark task (found
in the failed job's Python traceback). Never tried again: a deterministic refusal
(``WriteError``, ``ConfigurationError``: a task returns it in its ack, and every round
would meet it again), a ``FencedError`` (another driver's decision stands), an injected
fault (a test's crash), or anything unknown. The single pass (:mod:`txsink.protocol.singlepass`)
passes its own rule: a failed barrier job (its refusals come back as votes).

Failure scenarios, each pinned by ``tests/test_rounds.py``:

(1) A target unreachable during the pre-commit: a task raises ``RetryableError``, the job
    fails; the round is voided and aborted, and a new round runs after 0.5, 1, 2, 4, 4...
    seconds, until one is decided.
(2) The outage outlasts ``outage_s`` (counted from the epoch's first failure): the last
    round's failure ends the epoch (``EpochAbortedError``), as without this module; the
    query fails and the restart's recovery starts clean.
(3) A row a target refuses: the epoch is aborted at once, never run again.
(4) A target unreachable during the commit step: the sink's share is committed again
    after the same pauses; past ``outage_s`` the error is raised, the decision stands, and
    the next run's recovery commits the epoch.
(5) The driver dies during a pause: the voided round can never be decided; the next
    run's recovery aborts what it left.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, Protocol, TypeVar

from txsink.errors import (
    SECONDARY_NOTE,
    TASK_ERROR_MARKER,
    ConfigurationError,
    FencedError,
    InjectedFault,
    RetryableError,
    spark_condition,
)
from txsink.observe.logs import EpochLogger
from txsink.protocol.taskerror import carried, describe

__all__ = [
    "OUTAGE_ENV",
    "OUTAGE_S",
    "ROUND_PAUSE_MAX_S",
    "ROUND_PAUSE_MIN_S",
    "OutageBound",
    "RoundSteps",
    "describe",
    "outage_bound_s",
    "retry_transient",
    "run_in_rounds",
    "transient",
]

T = TypeVar("T")

#: The pauses between tries while a target is unreachable (doubling from the first).
ROUND_PAUSE_MIN_S = 0.5
ROUND_PAUSE_MAX_S = 4.0

_PYTHON_TASK_FAILURE = "org.apache.spark.api.python.PythonException"

_clock, _sleep = time.monotonic, time.sleep

#: The default of ``Coordinator(outage_s=)``, and the variable that overrides it.
OUTAGE_S = 60.0
OUTAGE_ENV = "TXSINK_OUTAGE_S"


def outage_bound_s(given: float | None) -> float:
    """``Coordinator(outage_s=)``: as given, else ``$TXSINK_OUTAGE_S``, else 60 s."""
    if given is None:
        found = os.environ.get(OUTAGE_ENV, "").strip()
        try:
            given = float(found) if found else OUTAGE_S
        except ValueError:
            raise ConfigurationError(
                f"{OUTAGE_ENV}={found!r} is not a number of seconds: set it to how long an "
                "epoch rides out an unreachable target (0: not at all), or unset it",
                phase="check",
            ) from None
    if given < 0:
        raise ConfigurationError(
            f"outage_s={given} is negative: give how long an epoch rides out an unreachable "
            "target, in seconds (0: not at all)",
            phase="check",
        )
    return given


def transient(err: BaseException) -> bool:
    """Whether ``err`` is a transient failure: a :class:`~txsink.errors.RetryableError`
    here, or one a Spark task raised: carried to the driver (:func:`txsink.protocol.taskerror.
    carried`), else read from the task's traceback (a task outside txsink's task code)."""
    found = carried(err)
    if found is not None:
        return isinstance(found, RetryableError) and not isinstance(found, InjectedFault)
    return task_error_type(err) == f"{RetryableError.__module__}.{RetryableError.__name__}"


def task_error_type(err: BaseException) -> str | None:
    """The qualified type of the Python exception a failed Spark task raised
    (``txsink.errors.RetryableError``); None when ``err`` is no failed Python task."""
    line = task_error_line(err)
    name = None if line is None else line.split(":", 1)[0]
    return name if name and name.replace(".", "").replace("_", "").isalnum() else None


def task_error_line(err: BaseException) -> str | None:
    """The last line of a failed Spark task's Python traceback (``Type: message``).

    Spark gives it two ways: a ``PythonException`` of condition ``PYTHON_EXCEPTION``
    whose ``traceback`` parameter is the task's traceback (a plain job), or a
    ``Py4JJavaError`` whose JVM causes hold Spark's ``PythonException`` (a barrier job).
    """
    params = getattr(err, "getMessageParameters", None)
    if callable(params) and spark_condition(err) == "PYTHON_EXCEPTION":
        return _last_line(str((params() or {}).get("traceback", "")))
    java, seen = getattr(err, "java_exception", None), 0
    while java is not None and seen < 20:
        try:
            if str(java.getClass().getName()) == _PYTHON_TASK_FAILURE:
                return _last_line(str(java.getMessage() or ""))
            java = java.getCause()
        except Exception:  # the JVM is gone: no traceback to read
            return None
        seen += 1
    return None


def _last_line(traceback: str) -> str | None:
    # Notes follow the exception's own line: the error a task carries (txsink.protocol.taskerror),
    # a clean-up's failure; they are not the task's error.
    notes = (TASK_ERROR_MARKER, SECONDARY_NOTE)
    lines = [line.strip() for line in traceback.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(notes)]
    return lines[-1] if lines else None


@dataclass
class OutageBound:
    """How long an epoch keeps trying while a target is unreachable: ``outage_s`` from its
    first failure, with pauses doubling from :data:`ROUND_PAUSE_MIN_S` to
    :data:`ROUND_PAUSE_MAX_S`. One per epoch step (the pre-commit, the commit)."""

    outage_s: float
    #: Injectable for tests; by default the module's ``_clock`` and ``_sleep``.
    clock: Callable[[], float] | None = None
    sleep: Callable[[float], None] | None = None
    _first: float | None = None
    _pause: float = ROUND_PAUSE_MIN_S

    def left(self) -> float:
        """Seconds left to try (marks the first failure when called after one)."""
        now = (self.clock or _clock)()
        if self._first is None:
            self._first = now
        return self.outage_s - (now - self._first)

    def pause(self, logger: EpochLogger, what: str, why: str) -> None:
        """One WARNING (``what`` failed, ``why``; when it is tried again), then the pause."""
        left = max(self.left(), 0.0)
        wait = min(self._pause, left)
        logger.warning(
            "%s (%s): trying again in %.1f s (outage_s=%.0f: %.0f s left before the query fails)",
            what,
            why,
            wait,
            self.outage_s,
            left,
        )
        (self.sleep or _sleep)(wait)
        self._pause = min(self._pause * 2, ROUND_PAUSE_MAX_S)


class RoundSteps(Protocol):
    """What :func:`run_in_rounds` does to one epoch's rounds: claim a new one, void a failed
    one (it can never be decided, its transactions aborted), or abort the epoch.

    :meth:`txsink.protocol.recovery.Recovery.rounds` gives the protocol's: the same void
    and abort recovery runs for an undecided round it finds."""

    def claim(self) -> int: ...

    def void(self, round_: int, err: BaseException) -> None: ...

    def abort(self, round_: int, err: BaseException) -> NoReturn: ...


def run_in_rounds(
    round_: int,
    *,
    run: Callable[[int], T],
    retry: Callable[[Exception], bool],
    steps: RoundSteps,
    bound: OutageBound,
    logger: EpochLogger,
    describe: Callable[[BaseException], str],
    retries: int = 0,
    stands: Callable[[BaseException], bool] = lambda err: False,
) -> tuple[int, T]:
    """``run(round)`` until it returns (the epoch decided); that round and its result.

    A failure ``retry`` accepts is voided (``steps.void``: the round can never be decided,
    its transactions aborted) and the epoch runs again in a new round (``steps.claim``): at
    once ``retries`` times (Spark's task retries, for a barrier stage Spark never retries),
    then after each of ``bound``'s pauses until it is spent. Any other failure, or the last
    one, aborts the epoch (``steps.abort`` raises). A ``FencedError``, or a failure after
    which the decision ``stands``, is raised as it is: only recovery may finish that epoch.
    """
    while True:
        try:
            return round_, run(round_)
        except FencedError:
            raise  # another driver decided or voided this epoch: its decision stands
        except BaseException as err:
            if stands(err):
                raise
            if not isinstance(err, Exception) or not retry(err):
                steps.abort(round_, err)
            if retries <= 0 and bound.left() <= 0:
                steps.abort(round_, err)
            steps.void(round_, err)
            what = f"round {round_} failed before its decision"
            if retries > 0:
                bound.left()  # the outage is counted from the first failure
                retries -= 1
                logger.warning("%s (%s): running the epoch again", what, describe(err))
            else:
                bound.pause(logger, what, describe(err))
            round_ = steps.claim()


def retry_transient(
    step: Callable[[], T], *, bound: OutageBound, logger: EpochLogger, what: str
) -> T:
    """``step()``, tried again after ``bound``'s pauses while it fails transiently (the
    commit step: idempotent). The last failure, or any other, is raised."""
    while True:
        try:
            return step()
        except Exception as err:
            if not transient(err) or bound.left() <= 0:
                raise
            bound.pause(logger, what, describe(err))
