"""A task's error, carried to the driver through a Spark failure, and any failure told in
one line.

A txsink task returns the errors no retry can fix in its result (pickled, whole). The
ones it raises (a :class:`~txsink.errors.RetryableError`, so that Spark retries the
task; an injected fault; anything a connector let escape) reach the driver only as
Spark's failure of the job: a ``PythonException`` (classic PySpark or Spark Connect) or a
``Py4JJavaError`` whose text holds the task's Python traceback. So the task adds one note
to what it raises (:func:`mark`): a line ``txsink-task-error: {json}`` with the error's
type, message and context. Python prints notes after the exception's own line, so the
line travels in the traceback text, and :func:`carried` finds it on the driver and
rebuilds the error: the executor's exception type and message, with the sink, the
partition or shard and the phase, instead of ``PythonException()``.

Only JSON is read back, and only a subclass of :class:`~txsink.errors.TxsinkError` in a
``txsink`` module is rebuilt (anything else as a ``TxsinkError`` naming its type): the
text can hold data from a target (a row echoed in a server's message), which must never
be unpickled or imported from.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
from typing import TYPE_CHECKING, Any

from txsink.errors import (
    ERROR_NOTE_MARKER,
    SECONDARY_NOTE,
    TASK_ERROR_MARKER,
    EpochAbortedError,
    FencedError,
    TxsinkError,
    add_secondary,
)
from txsink.observe.failure import FINDERS, failure_texts
from txsink.observe.logs import one_line

if TYPE_CHECKING:
    from collections.abc import Iterator

    from txsink.observe.logs import EpochLogger

__all__ = [
    "MARKER",
    "carried",
    "cleanup_after",
    "describe",
    "document",
    "epoch_aborted",
    "failure_text",
    "failure_texts",
    "from_task",
    "mark",
    "rebuild",
    "task_paragraph",
    "unless_raised_again",
]

MARKER = TASK_ERROR_MARKER
_MAX_MESSAGE = 2000
_PLAIN_CONTEXT = ("sink_uid", "epoch", "partition", "shard", "phase", "connector", "column")


def mark(err: BaseException, **context: Any) -> BaseException:
    """Add the note that carries ``err`` to the driver (once); returns ``err``.

    ``context`` fills what a txsink error lacks, or is the context of any other error.
    """
    if any(str(n).startswith(MARKER) for n in getattr(err, "__notes__", ())):
        return err
    err.add_note(MARKER + json.dumps(document(err, **context), default=str))
    return err


def document(err: BaseException, **context: Any) -> dict[str, Any]:
    """``err`` as the JSON-able document a task sends the driver (in :func:`mark`'s note,
    or in a single-pass task's failed vote): its type, message and plain context;
    :func:`rebuild` makes the error of it again. ``context`` as for :func:`mark`."""
    cls: type[BaseException] = type(err)
    if isinstance(err, TxsinkError):
        err.with_context(**context)
        message, ctx = err.message, dict(err.context)
        row = ctx.pop("row", None)
        if row is not None:
            message = f"{message} (row {row})" if not isinstance(row, int) else message
            if isinstance(row, int):
                ctx["row"] = row
    else:
        message = str(err)
        ctx = {k: v for k, v in context.items() if v is not None}
    return {
        "type": f"{cls.__module__}:{cls.__qualname__}",
        "message": message[:_MAX_MESSAGE],
        "context": {k: v for k, v in ctx.items() if k in (*_PLAIN_CONTEXT, "row")},
    }


def carried(err: BaseException) -> TxsinkError | None:
    """The txsink error a failed task carried in ``err`` (a Spark failure), or None.

    A txsink error is returned as it is. When a task was retried, the failure tells the
    last attempt; its marker is the last one in the text.
    """
    if isinstance(err, TxsinkError):
        return err
    doc = None
    for text in failure_texts(err):
        for line in text.splitlines():
            at = line.find(MARKER)
            if at < 0:
                continue
            try:
                found = json.loads(line[at + len(MARKER) :])
            except ValueError:
                continue
            if isinstance(found, dict):
                doc = found
    return None if doc is None else rebuild(doc)


def rebuild(doc: dict[str, Any]) -> TxsinkError:
    """The txsink error a task's :func:`document` describes (only a ``txsink`` class is
    rebuilt as itself; :func:`from_task` is true of it)."""
    type_name = str(doc.get("type", "Exception"))
    message = str(doc.get("message", ""))
    raw = doc.get("context")
    ctx = {k: v for k, v in (raw if isinstance(raw, dict) else {}).items() if k in _PLAIN_CONTEXT}
    if isinstance(raw, dict) and isinstance(raw.get("row"), int):
        ctx["row"] = raw["row"]
    cls = _txsink_class(type_name)
    if cls is None:
        short = type_name.rsplit(":", 1)[-1]
        cls, message = TxsinkError, f"{short}: {message}" if message else short
    err = cls.__new__(cls)
    TxsinkError.__init__(err, message, **ctx)
    if isinstance(err, EpochAbortedError):
        err.causes = []  # its own field, which __init__ was not run to set
    err._txsink_task = True  # type: ignore[attr-defined]
    return err


def from_task(err: BaseException) -> bool:
    """Whether ``err`` was rebuilt by :func:`carried` from a failed task."""
    return bool(getattr(err, "_txsink_task", False))


def _txsink_class(type_name: str) -> type[TxsinkError] | None:
    module, _, name = type_name.partition(":")
    if not (module == "txsink" or module.startswith("txsink.")) or not name.isidentifier():
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) and issubclass(found, TxsinkError) else None


def describe(err: BaseException) -> str:
    """``err`` in one line for a message: a txsink error (carried from a task, too) as
    it prints; a failed Python task by the last line of its traceback; a JVM failure by
    its deepest cause's message; anything else as ``Type: first line``."""
    found = carried(err)
    if found is not None:
        return f"{type(found).__name__}: {found}"
    params = getattr(err, "getMessageParameters", None)
    if callable(params):
        try:
            trace = str((params() or {}).get("traceback", ""))
        except Exception:
            trace = ""
        lines = [
            line.strip()
            for line in trace.splitlines()
            if line.strip() and not line.startswith(ERROR_NOTE_MARKER)
        ]
        if lines:
            return lines[-1][:500]
    java = getattr(err, "java_exception", None)
    if java is not None:
        texts = failure_texts(err)[1:]
        if texts:
            return _first_line(texts[-1])
    return f"{type(err).__name__}: {_first_line(str(err))}"


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return (lines[0] if lines else "")[:500]


@contextlib.contextmanager
def cleanup_after(primary: BaseException, during: str, log: EpochLogger) -> Iterator[None]:
    """Around the clean-up after ``primary`` (aborts, a void): if it fails too,
    ``primary`` is raised, with that failure as a note and a WARNING, never the clean-up's
    failure instead of it (a target down fails the pre-commit, then the aborts). A
    :class:`~txsink.errors.FencedError` (another driver's decision stands) goes on."""
    try:
        yield
    except FencedError:
        raise
    except Exception as cleanup:
        add_secondary(primary, cleanup, during)
        log.warning("%s failed too (recovery finishes it): %s", during, describe(cleanup))
        raise primary from primary.__cause__


def epoch_aborted(epoch: int, err: BaseException) -> BaseException:
    """What to raise after ``epoch``'s pre-commit failed with ``err`` and its round was
    voided: ``err`` itself if it is an epoch's abort already (or not an ``Exception``);
    else the abort, told by the error a task carried (a Spark failure, or one
    :func:`carried` rebuilt already), type and context included, or as
    :meth:`EpochAbortedError.wrapping` tells it; ``err`` is its ``__cause__``, and the
    notes of a failed clean-up on ``err`` (:func:`cleanup_after`) are its notes too."""
    if isinstance(err, EpochAbortedError) or not isinstance(err, Exception):
        return err
    task = carried(err) if not isinstance(err, TxsinkError) else err if from_task(err) else None
    aborted = EpochAbortedError.wrapping(epoch, err, failure_text(err), task_error=task)
    aborted.__cause__ = err
    for note in getattr(err, "__notes__", ()):  # a clean-up's failure, told beside it
        if str(note).startswith(SECONDARY_NOTE):
            aborted.add_note(note)
    return aborted


#: A Java exception's class name inside a JVM message ("org.apache.spark.SparkException: ").
_JAVA_CLASS = re.compile(r"\b(?:[a-z][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error): ")


def failure_text(err: BaseException) -> str | None:
    """One line for a failed Spark call: the JVM exception's own message (not py4j's "An
    error occurred while calling o73.collectToPython"), without Java class names, cut at a
    word. ``None`` when ``err`` carries no JVM exception."""
    java = getattr(err, "java_exception", None)
    if java is None:
        return None
    try:
        message = str(java.getMessage() or java.toString())
    except Exception:  # the JVM is gone: nothing better to say than py4j's own text
        return None
    return "Spark job failed: " + one_line(_JAVA_CLASS.sub("", message), 300)


def unless_raised_again(err: BaseException) -> contextlib.AbstractContextManager[None]:
    """Around a clean-up that raises ``err`` itself when it fails too
    (:func:`cleanup_after`): that raise is swallowed, so the caller tells ``err``."""
    return _Unless(err)


class _Unless(contextlib.AbstractContextManager[None]):
    def __init__(self, err: BaseException) -> None:
        self.err = err

    def __exit__(self, kind: object, value: BaseException | None, tb: object) -> bool:
        return value is not None and value is self.err


def task_paragraph(err: BaseException) -> dict[str, Any] | None:
    """A failed task's error that no coordinator told (the Data Source path: the query
    ends on the task's failure), as the paragraph :func:`txsink.observe.failure.excepthook`
    prints; or None."""
    found = carried(err)
    if found is None:
        return None
    epoch = None if found.epoch is None else f"epoch {found.epoch}"
    where = " ".join(p for p in (found.sink_uid, epoch) if p)
    text = f"{type(found).__name__}: {' '.join(str(found).split())}"
    return {"type": type(found).__name__, "paragraph": f"[{where}] {text}" if where else text}


FINDERS.append(task_paragraph)
