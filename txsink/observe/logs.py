"""Logging: the epoch and sink uid in every record, and what txsink prints by itself.

Records carry ``txsink_epoch`` and ``txsink_uid`` as attributes (for structured
handlers) and as a ``[uid=… epoch=…]`` prefix (for plain ones).

When the user has configured no logging (no handler on the root logger nor on the
``txsink`` logger), the first coordinator of the process attaches one handler to the
``txsink`` logger (:func:`install_console`): one line per record on stderr, at INFO, as
``txsink: [demo epoch 3] committed: demo 1,200 rows (precommit 1.2 s, ...)`` (the level
is named from WARNING up). Any logging configuration of the user's wins, even one made
later: the handler then stays silent and the records go to the user's handlers alone.
``TXSINK_LOG=off|error|warning|info|debug`` or :func:`configure_logging` silence or
redirect it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, TextIO

__all__ = [
    "ENV_VAR",
    "ConsoleHandler",
    "EpochLogger",
    "committed_text",
    "configure_logging",
    "console_prints",
    "failures_logged",
    "get_logger",
    "install_console",
    "log_failure",
    "one_line",
    "seconds_text",
]

#: The switch of txsink's own output: ``off``, ``error``, ``warning``, ``info`` or ``debug``.
ENV_VAR = "TXSINK_LOG"
_OFF = logging.CRITICAL + 10
_LEVELS = {
    "off": _OFF,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}
_ROOT = "txsink"


class EpochLogger(logging.LoggerAdapter[logging.Logger]):
    def __init__(self, logger: logging.Logger, uid: str | None, epoch: int | None) -> None:
        super().__init__(logger, {"txsink_uid": uid, "txsink_epoch": epoch})

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return f"{_prefix(extra['txsink_uid'], extra['txsink_epoch'])}{msg}", kwargs

    def bind(self, *, uid: str | None = None, epoch: int | None = None) -> EpochLogger:
        extra = self.extra or {}
        return EpochLogger(
            self.logger,
            uid if uid is not None else extra.get("txsink_uid"),  # type: ignore[arg-type]
            epoch if epoch is not None else extra.get("txsink_epoch"),  # type: ignore[arg-type]
        )


def get_logger(name: str, *, uid: str | None = None, epoch: int | None = None) -> EpochLogger:
    return EpochLogger(logging.getLogger(name), uid, epoch)


def _prefix(uid: object, epoch: object) -> str:
    return f"[uid={uid} epoch={epoch}] "


# -- the text of the per-epoch line ------------------------------------------------------


def seconds_text(seconds: float) -> str:
    """A phase's duration for a person: ``8 ms``, ``1.2 s``, ``75 s``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def committed_text(rows: Mapping[str, int], seconds: Mapping[str, float]) -> str:
    """``orders 1,200 rows, pg 1,200 rows (precommit 1.2 s, decide 6 ms, commit 30 ms)``:
    the rows per sink uid, then each phase in ``seconds``."""
    counts = ", ".join(f"{uid} {n:,} row{'' if n == 1 else 's'}" for uid, n in rows.items())
    phases = [f"{phase} {seconds_text(value)}" for phase, value in seconds.items()]
    return f"{counts} ({', '.join(phases)})" if phases else counts


def one_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, cut at a word before ``limit`` characters
    with an ellipsis (never mid-word)."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "…"


# -- txsink's own output -----------------------------------------------------------------


class _ConsoleFormatter(logging.Formatter):
    """``txsink: [uid epoch N] message``; ``txsink: WARNING [uid] message`` from WARNING up."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        uid = getattr(record, "txsink_uid", None)
        epoch = getattr(record, "txsink_epoch", None)
        if hasattr(record, "txsink_uid"):
            text = text.removeprefix(_prefix(uid, epoch))
        where = " ".join(p for p in (uid, None if epoch is None else f"epoch {epoch}") if p)
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        line = f"txsink: {level}{f'[{where}] ' if where else ''}{text}"
        if record.exc_info and record.exc_info[1] is not None:
            err = record.exc_info[1]
            line += f" ({one_line(f'{type(err).__name__}: {err}')})"
        return line


class ConsoleHandler(logging.Handler):
    """txsink's own output: one line per record, to ``stream`` (default: stderr, as it is
    at each record). The automatic one (``explicit=False``) stays silent once the user has
    configured logging (a handler on the root logger or on ``txsink``)."""

    def __init__(
        self, stream: TextIO | None = None, *, level: int = logging.INFO, explicit: bool = False
    ) -> None:
        super().__init__(level)
        self.explicit = explicit
        self._stream = stream
        self.setFormatter(_ConsoleFormatter())

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.explicit and _user_configured():
            return False
        return bool(super().filter(record))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = self._stream or sys.stderr
            stream.write(_line_break_first(stream) + self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


#: Spark's setting of its console progress bar (``[Stage 0:> ... (0 + 1) / 1]``).
_PROGRESS_CONF = "spark.ui.showConsoleProgress"


def _line_break_first(stream: TextIO) -> str:
    """``"\n"`` when txsink's line must not start where it stands: another writer of the
    same stream left its last line open. Spark's console progress bar draws with ``\r``
    and clears itself with spaces and ``\r``, never a newline, so on a terminal its line
    is gone, but in a file or a pipe the next line would be glued to it.

    - a terminal: nothing (the bar has cleared its line before a txsink line: Spark clears
      it at the end of every job);
    - a regular file: a newline exactly when the file's last byte is not one (read back
      through ``/proc/self/fd``, which also opens a write-only file);
    - a pipe: no way to look back, so a newline whenever this process's Spark session has
      its progress bar on (a blank line where the bar did not draw)."""
    try:
        stream.flush()
        fd = stream.fileno()
        if os.isatty(fd):
            return ""
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode):
            if info.st_size == 0:
                return ""
            with open(f"/proc/self/fd/{fd}", "rb") as again:
                again.seek(info.st_size - 1)
                return "" if again.read(1) == b"\n" else "\n"
    except (AttributeError, OSError, ValueError):  # no file behind it (StringIO), no /proc
        return ""
    return "\n" if _progress_bar_on() else ""


def _progress_bar_on() -> bool:
    """Whether the classic Spark session of this process (if any) draws the progress bar;
    not asked when PySpark's context module was never imported."""
    module = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    context = getattr(getattr(module, "SparkContext", None), "_active_spark_context", None)
    if context is None:
        return False
    try:
        return str(context.getConf().get(_PROGRESS_CONF, "false")).lower() == "true"
    except Exception:  # a stopped context: py4j gone
        return False


def console_prints(level: int) -> bool:
    """Whether txsink's own console handler prints a record of ``level`` to this
    process's stderr or stdout (not when the user's logging took over, nor to a file)."""
    logger = logging.getLogger(_ROOT)
    if not logger.isEnabledFor(level):
        return False
    return any(
        isinstance(h, ConsoleHandler)
        and h.level <= level
        and (h.explicit or not _user_configured())
        and h._stream in (None, sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
        for h in logger.handlers
    )


def _user_configured() -> bool:
    handlers = (*logging.getLogger().handlers, *logging.getLogger(_ROOT).handlers)
    return any(not isinstance(h, ConsoleHandler) for h in handlers)


#: Whether this process has chosen its console output (at most once automatically).
_chosen: list[bool] = []


def install_console(default: str = "info") -> None:
    """txsink's output when the user configured no logging; once per process.

    Called by the first coordinator (and by the ``txsink`` command, with
    ``default="warning"``: its commands print what they did themselves). ``TXSINK_LOG``
    chooses the level; ``default`` applies without it. Adds nothing if the user's
    logging is configured.
    """
    if _chosen:
        return
    _chosen.append(True)
    if _user_configured():
        return
    text = os.environ.get(ENV_VAR, "").strip().lower()
    level = _LEVELS.get(text or default, _LEVELS[default])
    _attach(ConsoleHandler(level=level), level, force=False)
    if text and text not in _LEVELS:
        logging.getLogger(_ROOT).warning(
            "%s=%r is not one of %s: printing from %s up",
            ENV_VAR,
            text,
            ", ".join(_LEVELS),
            logging.getLevelName(level),
        )


def configure_logging(level: str | int = "info", *, stream: TextIO | None = None) -> None:
    """Choose what txsink prints by itself, and where.

    ``level``: ``"off"``, ``"error"``, ``"warning"``, ``"info"`` (the default: one line
    per epoch, recovery actions and aborts) or ``"debug"``, or a :mod:`logging` level;
    ``stream``: a text stream (default: stderr). It replaces ``TXSINK_LOG`` and prints
    even when logging is configured otherwise; with your own handlers, set the level of
    the ``txsink`` logger in your configuration instead.
    """
    if isinstance(level, str):
        if level.lower() not in _LEVELS:
            raise ValueError(f"level {level!r}: expected one of {', '.join(_LEVELS)}")
        level = _LEVELS[level.lower()]
    _chosen.append(True)
    _attach(ConsoleHandler(stream, level=level, explicit=True), level, force=True)


def _attach(handler: ConsoleHandler, level: int, *, force: bool) -> None:
    """Replace txsink's console handler (an ``off`` one still takes the records, so that
    Python's last-resort handler does not print WARNINGs) and set the ``txsink`` logger's
    level to it: always when ``force``d, else only if the user left it unset."""
    logger = logging.getLogger(_ROOT)
    for old in [h for h in logger.handlers if isinstance(h, ConsoleHandler)]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    if level < _OFF and (force or logger.level == logging.NOTSET):
        logger.setLevel(level)


# -- errors, logged once before Spark wraps them ------------------------------------------


def log_failure(logger: EpochLogger, err: BaseException, *, epoch: int | None = None) -> None:
    """Log ``err`` at ERROR on one line, with its context, once: before it is raised on to
    Spark, which wraps it in a long JVM trace. An error already logged (by an inner entry
    point) is not logged again."""
    from txsink.errors import TxsinkError

    if getattr(err, "_txsink_logged", False):
        return
    if isinstance(err, TxsinkError):
        text = " ".join(str(err).split())
        uid, epoch = err.sink_uid, err.epoch if err.epoch is not None else epoch
    else:  # not a txsink error: its first line is enough (a JVM trace may follow)
        text, uid = one_line(str(err), 500), None
    logger.bind(uid=uid, epoch=epoch).error("%s: %s", type(err).__name__, text)
    if isinstance(err, TxsinkError):  # carried through Spark's texts (txsink.observe.failure)
        from txsink.observe.failure import mark

        where = " ".join(p for p in (uid, None if epoch is None else f"epoch {epoch}") if p)
        paragraph = f"{f'[{where}] ' if where else ''}{type(err).__name__}: {text}"
        mark(err, paragraph, printed=console_prints(logging.ERROR))
    with contextlib.suppress(AttributeError):  # an exception type without a __dict__
        err._txsink_logged = True  # type: ignore[attr-defined]


@contextlib.contextmanager
def failures_logged(
    logger: EpochLogger,
    *,
    epoch: int | None = None,
    on_failure: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Around an entry point Spark calls: an exception leaving it is logged once
    (:func:`log_failure`), ``on_failure`` runs, and the exception is raised on."""
    try:
        yield
    except Exception as err:
        log_failure(logger, err, epoch=epoch)
        if on_failure is not None:
            try:
                on_failure()
            except Exception as cleanup:  # never instead of the failure it follows
                logger.bind(epoch=epoch).warning("clean-up after the failure failed: %s", cleanup)
                cleanup_text = one_line(f"{type(cleanup).__name__}: {cleanup}", 500)
                err.add_note(f"(then the clean-up failed too: {cleanup_text})")
        raise
