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
from typing import Any

from txsink.errors import TASK_ERROR_MARKER, EpochAbortedError, TxsinkError

__all__ = ["MARKER", "carried", "describe", "failure_texts", "from_task", "mark"]

MARKER = TASK_ERROR_MARKER
_MAX_MESSAGE = 2000
_PLAIN_CONTEXT = ("sink_uid", "epoch", "partition", "shard", "phase", "connector", "column")


def mark(err: BaseException, **context: Any) -> BaseException:
    """Add the note that carries ``err`` to the driver (once); returns ``err``.

    ``context`` fills what a txsink error lacks, or is the context of any other error.
    """
    if any(str(n).startswith(MARKER) for n in getattr(err, "__notes__", ())):
        return err
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
    doc = {
        "type": f"{cls.__module__}:{cls.__qualname__}",
        "message": message[:_MAX_MESSAGE],
        "context": {k: v for k, v in ctx.items() if k in (*_PLAIN_CONTEXT, "row")},
    }
    err.add_note(MARKER + json.dumps(doc, default=str))
    return err


def failure_texts(err: BaseException) -> list[str]:
    """Every text a Spark failure carries: its message, a ``PythonException``'s traceback
    parameter, and the messages of a JVM exception and its causes (a ``Py4JJavaError``
    says only "An error occurred while calling o267.collectToPython")."""
    texts = [str(err)]
    params = getattr(err, "getMessageParameters", None)
    if callable(params):
        with contextlib.suppress(Exception):  # a JVM gone: the other texts are what is left
            texts.append(str((params() or {}).get("traceback", "")))
    java = getattr(err, "java_exception", None)
    seen = 0
    while java is not None and seen < 20:
        try:
            texts.append(str(java.toString()))
            java = java.getCause()
        except Exception:
            break
        seen += 1
    return [t for t in texts if t]


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
    return None if doc is None else _rebuild(doc)


def _rebuild(doc: dict[str, Any]) -> TxsinkError:
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
        lines = [line.strip() for line in trace.splitlines() if line.strip()]
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
