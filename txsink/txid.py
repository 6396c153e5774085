"""Transaction ids: deterministic, parseable names for prepared transactions.

A name says whose transaction it is, so recovery can find every lingering one
in the target system itself (``pg_prepared_xacts``, multipart uploads, staged
files) and decide its fate from the txsink log alone::

    txsink.<app>.<uid>.e<epoch>.r<round>.p<partition>.a<attempt>

``round`` numbers the pre-commit runs of one epoch (a replay after a crash is
a new round) and is claimed in the log, so two drivers never share a name.
``attempt`` is Spark's task attempt id, unique within one round's job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["NAME_PATTERN", "TxnId", "check_name"]

PREFIX = "txsink"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_PARSE = re.compile(
    r"^txsink\.(?P<app>[A-Za-z0-9_-]+)\.(?P<uid>[A-Za-z0-9_-]+)"
    r"\.e(?P<epoch>\d+)\.r(?P<round>\d+)\.p(?P<partition>\d+)\.a(?P<attempt>\d+)$"
)


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid app id or sink uid, else raise ``ValueError``.

    Names go into file names, Postgres gids, Kafka transactional ids and S3
    keys, so they are restricted to letters, digits, ``_`` and ``-``.
    """
    if not NAME_PATTERN.match(value):
        raise ValueError(
            f"{kind} {value!r} is not valid: use 1-64 letters, digits, '_' or '-', "
            "starting with a letter or digit"
        )
    return value


@dataclass(frozen=True, order=True)
class TxnId:
    """The identity of one prepared transaction of one sink in one task attempt."""

    app: str
    uid: str
    epoch: int
    round: int
    partition: int
    attempt: int

    def __post_init__(self) -> None:
        check_name("app id", self.app)
        check_name("sink uid", self.uid)
        for field in ("epoch", "round", "partition", "attempt"):
            if getattr(self, field) < 0:
                raise ValueError(f"TxnId.{field} must be >= 0, got {getattr(self, field)}")

    def __str__(self) -> str:
        return (
            f"{PREFIX}.{self.app}.{self.uid}.e{self.epoch}.r{self.round}"
            f".p{self.partition}.a{self.attempt}"
        )

    @classmethod
    def parse(cls, name: str) -> TxnId:
        """Parse the wire form; raise ``ValueError`` if ``name`` is not a txsink name."""
        m = _PARSE.match(name)
        if m is None:
            raise ValueError(f"not a txsink transaction name: {name!r}")
        return cls(
            app=m["app"],
            uid=m["uid"],
            epoch=int(m["epoch"]),
            round=int(m["round"]),
            partition=int(m["partition"]),
            attempt=int(m["attempt"]),
        )

    @classmethod
    def try_parse(cls, name: str) -> TxnId | None:
        """Like :meth:`parse` but returns ``None`` for foreign names."""
        try:
            return cls.parse(name)
        except ValueError:
            return None

    def belongs_to(self, app: str, uid: str) -> bool:
        return self.app == app and self.uid == uid
