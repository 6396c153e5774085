"""Logging with the epoch and sink uid in every record.

Records carry ``txsink_epoch`` and ``txsink_uid`` as attributes (for
structured handlers) and as a ``[uid=… epoch=…]`` prefix (for plain ones).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

__all__ = ["EpochLogger", "get_logger"]


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
