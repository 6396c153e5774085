"""One failure, one paragraph: txsink's error first and once, Spark's traces in a file.

A txsink error that stops a query reaches the user three more times after txsink's own
``txsink: ERROR …`` line: inside Spark's log4j record ``Query … terminated with error``
(the JVM trace, with the Python traceback inside py4j's "Return Message"), and inside the
``StreamingQueryException`` that ``awaitTermination()`` raises, printed by Python as a
traceback of ~60 lines. This module removes the repeats, never the error:

- :func:`mark` (called by :func:`txsink.observe.logs.log_failure`, at the entry points Spark
  calls) adds one note to a txsink error, ``txsink-error: {json}`` with its paragraph and
  whether txsink's console printed it, by which process on which host. Python prints
  notes after the exception's line, so the note travels in every text Spark wraps the
  error in: py4j's return message, ``PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR``, a
  Spark Connect error.
- :mod:`txsink.spark.jvmlog` denies Spark's log4j records that repeat the error (the query's
  ``terminated with error``, a failed task's records), from the user's process.
- :func:`excepthook` (installed by :func:`install_excepthook` when a coordinator is built
  or the Data Source is registered, only over Python's default hook): an uncaught
  exception whose text carries the note writes its whole traceback (Python's, py4j's,
  Spark's JVM trace) to a file (:func:`trace_dir`) and prints the paragraph (unless this
  console showed it already) and that file's path. Anything without the note goes to the
  previous hook untouched. ``TXSINK_TRACEBACK=full`` turns both off.

The trace file is written only when the exception ends the process: a caller that
catches the error has it whole, and no file is left behind by errors handled in code.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import socket
import sys
import sysconfig
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from txsink.errors import ERROR_NOTE_MARKER, restart_cannot_help

__all__ = [
    "FINDERS",
    "MARKER",
    "TRACEBACK_ENV",
    "TRACE_DIR_ENV",
    "carried_note",
    "ended_by_failure",
    "excepthook",
    "failure_texts",
    "full_traceback",
    "install_excepthook",
    "last_note",
    "mark",
    "trace_dir",
]

#: The line of a note that carries a txsink error through Spark's texts.
MARKER = ERROR_NOTE_MARKER
#: ``full``: print Spark's traces as Spark does (no hook, no log4j filter).
TRACEBACK_ENV = "TXSINK_TRACEBACK"
#: Where the trace files go (default: ``<temp dir>/txsink-traces``).
TRACE_DIR_ENV = "TXSINK_TRACE_DIR"


def full_traceback() -> bool:
    """Whether ``TXSINK_TRACEBACK=full`` asks for Spark's traces as Spark prints them."""
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() == "full"


def mark(err: BaseException, paragraph: str, *, printed: bool) -> None:
    """Add the note that carries ``err``'s ``paragraph`` (once); ``printed``: whether
    txsink's console printed it in this process."""
    if any(str(n).startswith(MARKER) for n in getattr(err, "__notes__", ())):
        return
    doc = {
        "type": type(err).__name__,
        "paragraph": paragraph,
        # Read where the error arrives only as Spark's text (the Data Source path): a
        # restarting runner stops at an error a restart would meet again.
        "fatal": restart_cannot_help(err),
        "printed": printed,
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    err.add_note(MARKER + json.dumps(doc))


def carried_note(err: BaseException) -> dict[str, Any] | None:
    """The last note :func:`mark` left in ``err``'s texts (its message, its chain, the
    traceback a Spark error carries, a JVM exception's messages), or None."""
    texts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.extend(str(n) for n in getattr(current, "__notes__", ()))
        try:
            texts.extend(failure_texts(current))
        except Exception:  # a JVM gone: what Python holds is what is left
            texts.append(str(current))
        current = current.__cause__ or current.__context__
    return last_note(texts)


def last_note(texts: list[str]) -> dict[str, Any] | None:
    """The last note :func:`mark` left in ``texts`` (wherever a text quotes it), or None."""
    found = None
    for text in texts:
        for line in text.splitlines():
            at = line.find(MARKER)
            if at < 0:
                continue
            try:
                doc = json.loads(line[at + len(MARKER) :])
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("paragraph"), str):
                found = doc
    return found


#: Where else a failure may carry a txsink error no coordinator told: each returns a
#: document as :func:`carried_note` does, or None (:mod:`txsink.protocol.taskerror` adds a failed
#: task's note, found in what the Data Source path's query ends on).
FINDERS: list[Callable[[BaseException], dict[str, Any] | None]] = []


def _found_elsewhere(err: BaseException) -> dict[str, Any] | None:
    for find in FINDERS:
        with contextlib.suppress(Exception):  # a JVM gone: Python prints it as it is
            doc = find(err)
            if doc is not None:
                return doc
    return None


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


# -- the trace file ----------------------------------------------------------------------


def trace_dir() -> Path:
    """Where trace files go: ``TXSINK_TRACE_DIR``, else ``<temp dir>/txsink-traces``.
    Not the txsink log's folder: the log store reads every file under it."""
    given = os.environ.get(TRACE_DIR_ENV, "").strip()
    return Path(given) if given else Path(tempfile.gettempdir()) / "txsink-traces"


_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def _write_trace(
    kind: type[BaseException], err: BaseException, tb: TracebackType | None, doc: dict[str, Any]
) -> Path | None:
    text = "".join(traceback.format_exception(kind, err, tb))
    java = getattr(err, "_stackTrace", None) or _call(err, "getStackTrace")
    if isinstance(java, str) and java and java not in text:
        text += f"\nJVM stacktrace:\n{java}\n"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = _NAME.sub("-", f"txsink-trace-{stamp}-{doc.get('type', 'error')}-{os.getpid()}")
    try:
        folder = trace_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.txt"
        path.write_text(f"txsink: {doc['paragraph']}\n\n{text}", encoding="utf-8")
    except OSError:
        return None
    return path.resolve()


def _call(err: BaseException, method: str) -> object:
    fn = getattr(err, method, None)
    if not callable(fn):
        return None
    try:
        return fn()
    except Exception:
        return None


# -- the hook ----------------------------------------------------------------------------


def _shown_here(doc: dict[str, Any], err: BaseException) -> bool:
    """Whether this console showed the paragraph already: printed by this process, or by
    a Python worker of this host's Spark (the Data Source path; its stderr is the
    driver's) when the failure came through classic PySpark, not Spark Connect (whose
    server prints to its own log)."""
    if not doc.get("printed"):
        return False
    if doc.get("pid") == os.getpid():
        return True
    connect = type(err).__module__.startswith("pyspark.errors.exceptions.connect")
    return not connect and doc.get("host") == socket.gethostname()


def _where(tb: TracebackType | None) -> str:
    frames = traceback.extract_tb(tb)
    if not frames:
        return ""
    last = frames[0]
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
    for frame in frames:  # the user's own last frame: outside pyspark, py4j, txsink, stdlib
        if not re.search(
            r"[/\\](pyspark|py4j|txsink)[/\\]", frame.filename
        ) and not os.path.realpath(frame.filename).startswith(stdlib):
            last = frame
    return f" at {os.path.basename(last.filename)}:{last.lineno}"


def excepthook(
    kind: type[BaseException],
    err: BaseException,
    tb: TracebackType | None,
    *,
    stream: TextIO | None = None,
) -> None:
    """Print a txsink failure as its paragraph and the path of its whole trace; hand
    anything else to the hook that was there before."""
    doc = None
    if not full_traceback() and isinstance(err, Exception):
        doc = carried_note(err) or _found_elsewhere(err)
    if doc is None:
        _previous[0](kind, err, tb)
        return
    out = stream or sys.stderr
    path = _write_trace(kind, err, tb, doc)
    where = f"{kind.__name__}{_where(tb)}"
    trace = (
        f"the whole trace (Python, py4j, Spark) is in {path}"
        if path is not None
        else f"set {TRACEBACK_ENV}=full to print the whole trace"
    )
    if _shown_here(doc, err):
        out.write(f"txsink: the query stopped on the error above ({where}); {trace}\n")
    else:
        out.write(f"txsink: ERROR {doc['paragraph']}\n")
        out.write(f"txsink: the query stopped on this error ({where}); {trace}\n")
    out.flush()
    _ended.append(True)


_previous: list[Any] = [sys.__excepthook__]
#: Whether :func:`excepthook` told a txsink failure that ends this process.
_ended: list[bool] = []


def ended_by_failure() -> bool:
    """Whether this process ends on a txsink failure the hook told (its exit may wait for
    the tasks Spark is killing, :mod:`txsink.spark.jvmlog`)."""
    return bool(_ended)


def install_excepthook() -> None:
    """Install :func:`excepthook` once, only over Python's default hook (a hook of the
    user's, IPython's or a test runner's stays), and not with ``TXSINK_TRACEBACK=full``."""
    if full_traceback() or sys.excepthook is not sys.__excepthook__:
        return
    _previous[0] = sys.excepthook
    sys.excepthook = excepthook
