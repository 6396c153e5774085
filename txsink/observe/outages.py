"""A client library's log, rate-limited: one WARNING per outage, one line when it ends.

Client libraries report every refused connection: while a broker is down for 15 s,
librdkafka logs some 200 lines at ERROR although the query survives. A connector routes
such a library's logger through an :class:`OutageFilter` (under the ``txsink`` logger,
so it reaches txsink's output and the user's handlers alike). The filter lets the first
connection failure through, rewritten as one WARNING (``Kafka broker 127.0.0.1:59092
unreachable: Connection refused; retrying``), drops the rest of the burst, and when the
connector's next operation succeeds (:meth:`OutageFilter.ended`) says so in one INFO line
with the outage's length and what it held back. Other records pass unchanged, with the
sink uid added.

What counts as a connection failure is the connector's to say (``classify``), by the
library's codes (librdkafka's log facility, an HTTP status, a SQLSTATE), never by message
text; the text only supplies who and why for the WARNING.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from txsink.observe.logs import seconds_text

__all__ = ["Failure", "OutageFilter"]

#: Set on the filter's own INFO line, so the filter lets it through untouched.
_OWN = "txsink_outage"


@dataclass(frozen=True)
class Failure:
    """A record read as a connection failure: who could not be reached, and why."""

    who: str
    reason: str


class OutageFilter(logging.Filter):
    """Turns a burst of connection failures into one WARNING, and its end into one line.

    ``classify(record)`` says whether a record reports a connection failure (a
    :class:`Failure`) or not (``None``). An outage opens at the first failure and ends
    at :meth:`ended`; a failure after ``quiet_s`` seconds without any opens a new one,
    so a forgotten :meth:`ended` never hides a later outage for long. Thread-safe: a
    library may log from its own threads.
    """

    def __init__(
        self,
        logger: logging.Logger,
        classify: Callable[[logging.LogRecord], Failure | None],
        *,
        uid: str | None = None,
        quiet_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.logger = logger
        self.classify = classify
        self.uid = uid
        self.quiet_s = quiet_s
        self.clock = clock
        self._lock = threading.Lock()
        self._open: Failure | None = None
        self._since = 0.0
        self._last = 0.0
        self._held = 0
        logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _OWN, False):
            return True
        failure = self.classify(record)
        if failure is not None:
            with self._lock:
                now = self.clock()
                if self._open is not None and now - self._last <= self.quiet_s:
                    self._last = now
                    self._held += 1
                    return False
                self._open, self._since, self._last, self._held = failure, now, now, 0
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "%s unreachable: %s; retrying", (failure.who, failure.reason)
            record.exc_info = record.exc_text = None
        self._tag(record)
        return True

    def ended(self) -> None:
        """The client reached its service again (an operation succeeded): if an outage
        was open, say so once, with its length and how many lines it held back."""
        with self._lock:
            failure, since, held = self._open, self._since, self._held
            self._open = None
        if failure is None:
            return
        # Past the library logger's own level (ERROR, say): the end of an outage is news.
        record = self.logger.makeRecord(
            self.logger.name,
            logging.INFO,
            __file__,
            0,
            "%s%s reachable again after %s (%d more failure line(s) held back)",
            (self._prefix(), failure.who, seconds_text(self.clock() - since), held),
            None,
            extra={_OWN: True, "txsink_uid": self.uid, "txsink_epoch": None},
        )
        self.logger.handle(record)

    def _tag(self, record: logging.LogRecord) -> None:
        """The sink uid on every record, as txsink's own records carry it."""
        if self.uid is not None and not hasattr(record, "txsink_uid"):
            record.txsink_uid, record.txsink_epoch = self.uid, None
            record.msg = f"{self._prefix()}{record.msg}"

    def _prefix(self) -> str:
        return f"[uid={self.uid} epoch=None] " if self.uid is not None else ""
