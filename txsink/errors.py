"""Exceptions raised by txsink.

The hierarchy::

    TxsinkError                      base; carries sink uid, epoch, partition, phase, connector
    ├── ConfigurationError           detected at start, before anything is written
    │   ├── UnsupportedQueryError    a query setting that breaks the guarantee
    │   ├── NonRestoredStateError    the log holds pending state for a sink uid not configured
    │   ├── CheckpointMismatchError  Spark's checkpoint and the txsink log disagree
    │   ├── DriverLeaseError         another live driver holds this query's lease
    │   ├── ConditionalWritesUnsupportedError  the log's store ignores If-None-Match
    │   └── UnsupportedSparkError    a feature the installed Spark line does not have
    ├── WriteError                   bad input: a row or column a sink cannot write (fatal)
    ├── RetryableError               transient (connection lost, timeout): Spark may retry the task
    ├── EpochAbortedError            the pre-commit failed; every handle of the epoch was aborted
    ├── FencedError                  another driver decided (or voided) this epoch first
    ├── CommitError                  a decided handle could not be committed: needs attention
    │   ├── EpochBlockedError        the target refuses the decided epoch until an operator fixes it
    │   └── NonDeterministicReplayError  a replayed epoch differs from the decided one
    ├── LogError                     the txsink log is unreadable or of an unknown format
    │   └── LogUnavailableError      its store did not answer for a moment (also a RetryableError)
    ├── HandleFormatError            a handle's serializer or version is unknown
    ├── InternalError                a bug of txsink (an API of Spark or a library it misread)
    └── InjectedFault                raised on purpose by :mod:`txsink.protocol.faults`

Every error pickles with its context, because Spark ships exceptions between
the Python workers and the driver. Retryable and fatal errors are different
types; connectors map their libraries' errors by code (SQLSTATE, Kafka error
code, HTTP status), never by message text. :func:`restart_cannot_help` says which
errors a restarted query would only meet again (the runner and the demo stop there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txsink.rowref import RowRef

__all__ = [
    "CheckpointMismatchError",
    "CommitError",
    "ConditionalWritesUnsupportedError",
    "ConfigurationError",
    "DriverLeaseError",
    "EpochAbortedError",
    "EpochBlockedError",
    "FencedError",
    "HandleFormatError",
    "InjectedFault",
    "InternalError",
    "LogError",
    "LogUnavailableError",
    "NonDeterministicReplayError",
    "NonRestoredStateError",
    "RetryableError",
    "SavepointError",
    "StateError",
    "TxsinkError",
    "UnreachableError",
    "UnsupportedQueryError",
    "UnsupportedSparkError",
    "WriteError",
    "add_secondary",
    "restart_cannot_help",
    "spark_condition",
]

_CONTEXT_KEYS = (
    "sink_uid",
    "epoch",
    "partition",
    "shard",
    "phase",
    "connector",
    "row",
    "column",
)


class TxsinkError(Exception):
    """Base of every txsink error.

    ``message`` says what happened and how to fix it; the keyword context says
    where (which sink, epoch, partition or shard, phase, row, column). ``str(err)`` puts
    both on one line, so a log line or a Spark stack trace is enough to act on:
    ``[sink_uid=pg, epoch=3, partition=1, phase=prepare, column=name] <message>
    (row key id=42 at partition 1, offset 28)``. A row is a
    :class:`~txsink.rowref.RowRef` (named by its key, or its first columns); an ``int``
    (a position, as connectors outside this repository may still pass) is shown as
    ``row=28``. Unset and empty fields are never printed.
    """

    def __init__(
        self,
        message: str,
        *,
        sink_uid: str | None = None,
        epoch: int | None = None,
        partition: int | None = None,
        shard: int | None = None,
        phase: str | None = None,
        connector: str | None = None,
        row: RowRef | int | None = None,
        column: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sink_uid = sink_uid
        self.epoch = epoch
        self.partition = partition
        self.shard = shard
        self.phase = phase
        self.connector = connector
        self.row = row
        self.column = column

    @property
    def context(self) -> dict[str, Any]:
        """The non-empty context fields, in a stable order."""
        return {k: v for k in _CONTEXT_KEYS if (v := getattr(self, k)) is not None and v != ""}

    def with_context(self, **context: Any) -> TxsinkError:
        """Fill context fields that are still unset; returns ``self``."""
        for key, value in context.items():
            if key not in _CONTEXT_KEYS:
                raise TypeError(f"with_context() got an unknown field {key!r}")
            if getattr(self, key) in (None, ""):
                setattr(self, key, value)
        return self

    def __str__(self) -> str:
        ctx = self.context
        row = ctx.get("row")
        named = row is not None and not isinstance(row, int)
        if named:
            del ctx["row"]
        text = self.message
        if named and str(row):
            text = f"{text} (row {row})"
        if not ctx:
            return text
        where = ", ".join(f"{k}={v}" for k, v in ctx.items())
        return f"[{where}] {text}"

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduce replays __init__(*args) and would drop the context.
        return (_rebuild, (type(self), self.message, self.context, self.__dict__.copy()))


def _rebuild(
    cls: type[TxsinkError], message: str, context: dict[str, Any], state: dict[str, Any]
) -> TxsinkError:
    err = cls.__new__(cls)
    TxsinkError.__init__(err, message, **context)
    err.__dict__.update(state)
    return err


def add_secondary(primary: BaseException, secondary: BaseException, during: str) -> None:
    """Attach ``secondary`` (a failure of the clean-up ``during`` that followed
    ``primary``) to ``primary`` as a note: the primary cause is what gets raised and
    logged; the clean-up's failure is told beside it, never instead of it."""
    lines = str(secondary).strip().splitlines()
    text = f"{type(secondary).__name__}: {lines[0] if lines else ''}"[:500]
    primary.add_note(f"{SECONDARY_NOTE}{during} failed too: {text})")


#: How the note of a clean-up's failure starts (:func:`add_secondary`).
SECONDARY_NOTE = "(then "


class ConfigurationError(TxsinkError):
    """A setting or server configuration that would break the guarantee; found at start."""


class UnsupportedQueryError(ConfigurationError):
    """The streaming query runs in a mode txsink cannot make exactly-once."""


class NonRestoredStateError(ConfigurationError):
    """The log holds pending handles for a sink uid that is not configured any more."""


class CheckpointMismatchError(ConfigurationError):
    """Spark's checkpoint and the txsink log describe different histories."""


class DriverLeaseError(ConfigurationError):
    """Another driver holds this query's lease in the txsink log and is alive.

    Raised by a starting driver (or ``txsink recover``) *before* it voids or aborts
    anything, so the running driver is never disrupted. Stop the other driver, or wait
    until its lease expires; ``txsink recover --break-lease`` when the holder is known to
    be dead on another host.
    """


class SavepointError(ConfigurationError):
    """A savepoint cannot be taken or restored (an epoch is decided but not committed,
    the target log is not empty, the savepoint is incomplete or of another format)."""


class StateError(ConfigurationError):
    """An operation on the txsink log's state (rename a uid, recover or abort by hand)
    cannot be done safely as asked; the message says what to do first."""


class WriteError(TxsinkError):
    """A row or value the sink cannot write. Fatal: retrying writes the same bad row."""


class RetryableError(TxsinkError):
    """A transient failure (connection lost, timeout). The task may be retried by Spark."""


class UnreachableError(ConfigurationError, RetryableError):
    """The start-up check cannot reach a target's server: a wrong address, or a server that
    is down or restarting. Refused before anything is written, like every check; unlike a
    setting, a restart may pass it once the server is back, so a restarting runner does
    restart (:func:`restart_cannot_help` is false for it)."""


class EpochAbortedError(TxsinkError):
    """The pre-commit of an epoch failed and every handle of it was aborted.

    Nothing of the epoch is visible. ``__cause__`` (or ``causes``) holds the
    error(s) of the failed partitions; fix the cause and restart the query.
    """

    def __init__(self, message: str, *, causes: list[TxsinkError] | None = None, **ctx: Any):
        super().__init__(message, **ctx)
        self.causes: list[TxsinkError] = list(causes or [])

    @classmethod
    def of(cls, epoch: int, causes: list[TxsinkError]) -> EpochAbortedError:
        """The epoch's abort, told by its first failed partition (all of them in ``causes``)."""
        first = causes[0]
        return cls(
            f"epoch {epoch} aborted, nothing of it is visible: {first.message}",
            causes=causes,
            **{**first.context, "epoch": epoch, "phase": "precommit"},
        )

    @classmethod
    def wrapping(
        cls,
        epoch: int,
        err: BaseException,
        text: str | None = None,
        *,
        task_error: TxsinkError | None = None,
    ) -> EpochAbortedError:
        """The epoch's abort caused by ``err``. The error a failed task carried in a Spark
        failure (``task_error``, found by :func:`txsink.protocol.taskerror.carried`) is told
        whole, type included; a failed Python task (Spark's condition
        ``PYTHON_EXCEPTION``) by the last line of its traceback, the task's own error;
        anything else by ``text`` (default: the first line of ``err``, as a JVM stack
        trace follows a Spark failure's message)."""
        if task_error is not None:  # carried from the task that failed (txsink.protocol.taskerror)
            kind = f"{type(task_error).__module__}.{type(task_error).__name__}"
            where = {k: task_error.context.get(k) for k in ("sink_uid", "partition", "shard")}
            return cls(
                f"epoch {epoch} aborted, nothing of it is visible: a task failed: "
                f"{kind}: {task_error}"[:2000],
                causes=[task_error],
                **{k: v for k, v in where.items() if v is not None},
                epoch=epoch,
                phase="precommit",
            )
        if isinstance(err, TxsinkError):
            return cls(
                f"epoch {epoch} aborted, nothing of it is visible: {err.message}",
                causes=[err],
                **{"epoch": epoch, **err.context},
            )
        last_line = _python_task_error(err)
        if last_line:
            text = f"a task failed: {last_line}"[:1000]
        elif text is None:
            lines = str(err).strip().splitlines()
            text = f"{type(err).__name__}: {lines[0] if lines else ''}"[:500]
        return cls(
            f"epoch {epoch} aborted, nothing of it is visible: {text}",
            epoch=epoch,
            phase="precommit",
        )


def _python_task_error(err: BaseException) -> str | None:
    """The last line of a failed Python task's traceback (``Type: message``), from a Spark
    error of condition ``PYTHON_EXCEPTION``; None for any other error."""
    params = getattr(err, "getMessageParameters", None)
    if not callable(params) or spark_condition(err) != "PYTHON_EXCEPTION":
        return None
    trace = str((params() or {}).get("traceback", "")).splitlines()
    # Notes follow the exception's own line: txsink's carried error, a clean-up's failure.
    lines = [
        line
        for line in trace
        if line and not line.startswith((TASK_ERROR_MARKER, ERROR_NOTE_MARKER, SECONDARY_NOTE))
    ]
    return lines[-1].strip() if lines else None


#: The line a task's note carries its error in (:mod:`txsink.protocol.taskerror`).
TASK_ERROR_MARKER = "txsink-task-error: "
#: The line a driver's note carries its error's paragraph in (:mod:`txsink.observe.failure`).
ERROR_NOTE_MARKER = "txsink-error: "


class FencedError(TxsinkError):
    """Another driver decided or voided this epoch first; this driver's handles were aborted."""


class CommitError(TxsinkError):
    """A handle of a decided epoch could not be committed.

    The decision stands: the next run's recovery retries the commit. If the
    handle's transaction is gone (aborted by hand, expired by the target), the
    rows of that handle are lost and the message says which.
    """


class EpochBlockedError(CommitError):
    """A decided epoch that the target refuses to commit until an operator changes it.

    *Permanent*: a retry fails the same way (a record larger than the topic's
    ``max.message.bytes``, a revoked grant, a deleted topic, a prepared transaction
    removed by hand). The message names the sink, the shard or partition, the record by
    its key where known, and the exact fix; ``fix`` holds the fix alone. The decision
    stands: once the cause is fixed, ``txsink recover`` (or a restarted query) commits
    the epoch, and the txsink log shows it as *blocked* meanwhile.
    Connectors raise it by error code (SQLSTATE, Kafka error code, S3 error code), never
    by message text; a transient failure stays a plain :class:`CommitError` or
    :class:`RetryableError`.
    """

    def __init__(self, message: str, *, fix: str = "", shard: int | None = None, **ctx: Any):
        super().__init__(message, **ctx)
        self.fix = fix
        self.shard = shard


class NonDeterministicReplayError(CommitError):
    """The replay of a decided epoch produced other rows than its pre-commit recorded.

    Raised by sinks that commit by reading the epoch again (Kafka replay mode)
    instead of writing something other than what was decided. The source or a
    transformation is not deterministic (``rand()``, ``current_timestamp()``, a
    non-replayable source): use the Kafka sink's WAL mode for such a query.
    """


class LogError(TxsinkError):
    """The txsink log cannot be read or written, or is of an unknown format version."""


class LogUnavailableError(LogError, RetryableError):
    """The log's store failed for a moment (connection lost, timeout, throttling, a server
    error): transient, so also a :class:`RetryableError`. Nothing was decided by the failed
    call; retrying it (the next run's recovery does) is safe."""


class ConditionalWritesUnsupportedError(ConfigurationError, LogError):
    """The log's object store does not honour ``If-None-Match: *``: it cannot hold a txsink log.

    Found at start, before anything is written (a :class:`ConfigurationError`),
    and about the log (a :class:`LogError`).
    """


class HandleFormatError(TxsinkError):
    """A handle was written by a serializer or version this txsink cannot read."""


class InjectedFault(TxsinkError):
    """Raised by a fault injected at a named crash point (mode ``raise``)."""


class InternalError(TxsinkError):
    """A bug of txsink, not a problem of the user's data or settings: an API of Spark or of
    a library answered in a way txsink does not expect (a ``TypeError`` or
    ``AttributeError`` from a call whose signature differs on the installed version).

    Fatal: a restart meets it again. The message names the installed versions (txsink,
    Python, PySpark, pyarrow, pandas) and asks for a bug report; ``__cause__`` is the
    original exception. Build it with :meth:`of`.
    """

    @classmethod
    def of(cls, err: BaseException, during: str, **ctx: Any) -> InternalError:
        """The internal error for ``err``, raised by txsink's own call ``during`` (``"the
        Arrow schema of the DataFrame"``)."""
        from txsink._version import installed_versions

        lines = str(err).strip().splitlines()
        versions = ", ".join(f"{k} {v}" for k, v in installed_versions().items())
        return cls(
            f"internal error in txsink while reading {during}: {type(err).__name__}: "
            f"{lines[0] if lines else ''}. This is a bug of txsink with these versions, not "
            f"a problem of your data or settings ({versions}): please report it with this "
            "message (docs/troubleshooting.md#internalerror)",
            **ctx,
        )


class UnsupportedSparkError(ConfigurationError):
    """A txsink feature that the installed Spark line does not have (the Python Data Source
    before Spark 4.0); the message names the installed version and what works on it."""


def spark_condition(err: object) -> str | None:
    """Spark's error condition of ``err`` (``"PYTHON_EXCEPTION"``), ``None`` for an
    exception that is not a Spark error. PySpark 4.x names it ``getCondition()``, 3.5
    ``getErrorClass()`` (the one version difference outside :mod:`txsink.spark.versions`,
    because the protocol room reads it too: it asks the exception, not the version)."""
    methods = [getattr(err, name, None) for name in ("getCondition", "getErrorClass")]
    for method in filter(callable, methods):
        try:
            found = method()
        except Exception:  # py4j answers any name, then fails the call: try the other
            found = None
        if found:
            return str(found)
    return None


def restart_cannot_help(err: BaseException) -> bool:
    """Whether a restarted query would only meet ``err`` again: a configuration error (a
    setting, a schema, a Spark line without the feature), a row the sink cannot write, a
    handle of an unknown format, an internal error, a decided epoch the target refuses for
    good (:class:`EpochBlockedError`: its commit fails the same way until an operator acts,
    and the restarted query's recovery would only report it again); or an epoch aborted by
    such errors alone. A restarting runner stops at the first of them (:mod:`txsink.runner`)
    so that the blocked or refused state reaches the operator, whose fix is in the message.

    Not these: a retryable error, an injected fault, a fenced driver, a commit to finish
    (recovery does), :class:`DriverLeaseError` (the other driver may end, or its lease
    expire) and :class:`UnreachableError` (the server may come back)."""
    if isinstance(err, EpochAbortedError):
        return bool(err.causes) and all(restart_cannot_help(c) for c in err.causes)
    if isinstance(err, (DriverLeaseError, RetryableError)):
        return False
    return isinstance(
        err, (ConfigurationError, WriteError, HandleFormatError, InternalError, EpochBlockedError)
    )
