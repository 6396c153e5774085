"""Logging with the epoch and sink uid in every record.

Records carry ``txsink_epoch`` and ``txsink_uid`` as attributes (for
structured handlers) and as a ``[uid=… epoch=…]`` prefix (for plain ones).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, MutableMapping
from typing import Any

from txsink.errors import TxsinkError

__all__ = ["EpochLogger", "failures_logged", "get_logger", "log_failure"]


class EpochLogger(logging.LoggerAdapter[logging.Logger]):
    def __init__(self, logger: logging.Logger, uid: str | None, epoch: int | None) -> None:
        super().__init__(logger, {"txsink_uid": uid, "txsink_epoch": epoch})

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return f"[uid={extra['txsink_uid']} epoch={extra['txsink_epoch']}] {msg}", kwargs

    def bind(self, *, uid: str | None = None, epoch: int | None = None) -> EpochLogger:
        extra = self.extra or {}
        return EpochLogger(
            self.logger,
            uid if uid is not None else extra.get("txsink_uid"),  # type: ignore[arg-type]
            epoch if epoch is not None else extra.get("txsink_epoch"),  # type: ignore[arg-type]
        )


def get_logger(name: str, *, uid: str | None = None, epoch: int | None = None) -> EpochLogger:
    return EpochLogger(logging.getLogger(name), uid, epoch)


def log_failure(logger: EpochLogger, err: BaseException, *, epoch: int | None = None) -> None:
    """Log ``err`` at ERROR on one line, with its context, once: before it is raised on to
    Spark, which wraps it in a long JVM trace. An error already logged (by an inner entry
    point) is not logged again."""
    if getattr(err, "_txsink_logged", False):
        return
    if isinstance(err, TxsinkError):
        text = " ".join(str(err).split())
        uid, epoch = err.sink_uid, err.epoch if err.epoch is not None else epoch
    else:  # not a txsink error: its first line is enough (a JVM trace may follow)
        first = str(err).strip().splitlines()
        text, uid = (first[0] if first else "")[:500], None
    logger.bind(uid=uid, epoch=epoch).error("%s: %s", type(err).__name__, text)
    with contextlib.suppress(AttributeError):  # an exception type without a __dict__
        err._txsink_logged = True  # type: ignore[attr-defined]


@contextlib.contextmanager
def failures_logged(logger: EpochLogger, *, epoch: int | None = None) -> Iterator[None]:
    """Around an entry point Spark calls: an exception leaving it is logged once
    (:func:`log_failure`) and raised on."""
    try:
        yield
    except Exception as err:
        log_failure(logger, err, epoch=epoch)
        raise
