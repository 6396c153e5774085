"""Handles: serialisable descriptions of prepared transactions.

A handle is what a partition task returns from ``prepare`` and what the
coordinator writes into the epoch's decision record; from it alone, on any
machine and after any crash, the connector must be able to commit or abort.

Handles are frozen dataclasses written as JSON under a *serializer name* and
*version*::

    {"serializer": "files.staged", "version": 1, "data": {...}}

Evolution rule (the TypeSerializerSnapshot discipline): a connector that bumps
``version`` keeps reading every older version in :meth:`Handle.decode`, or
raises :class:`~txsink.errors.HandleFormatError` naming both versions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Self, TypeVar

from txsink.errors import HandleFormatError
from txsink.txid import TxnId

__all__ = ["Handle", "dump_handle", "load_handle", "register_handle"]

_REGISTRY: dict[str, type[Handle]] = {}

H = TypeVar("H", bound="type[Handle]")


@dataclasses.dataclass(frozen=True)
class Handle:
    """Base of every connector's handle.

    Subclasses add their own fields (JSON-able values only, or override
    :meth:`encode`/:meth:`decode`) and set the two class variables.
    """

    serializer: ClassVar[str] = ""
    version: ClassVar[int] = 1

    txn: TxnId
    rows: int = 0
    nbytes: int = 0

    def encode(self) -> dict[str, Any]:
        """The ``data`` part of the JSON document."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["txn"] = str(self.txn)
        return data

    @classmethod
    def decode(cls, version: int, data: dict[str, Any]) -> Self:
        """Rebuild a handle written by ``version`` of this serializer."""
        if version != cls.version:
            raise HandleFormatError(
                f"handle serializer {cls.serializer!r} version {version} cannot be read by "
                f"this txsink (it reads version {cls.version}); upgrade txsink"
            )
        fields = dict(data)
        fields["txn"] = TxnId.parse(fields["txn"])
        return cls(**fields)


def register_handle(cls: H) -> H:
    """Class decorator: make a handle type loadable by its serializer name."""
    if not cls.serializer:
        raise TypeError(f"{cls.__name__} must set the class variable 'serializer'")
    other = _REGISTRY.get(cls.serializer)
    if other is not None and other.__qualname__ != cls.__qualname__:
        raise TypeError(f"handle serializer {cls.serializer!r} is already used by {other}")
    _REGISTRY[cls.serializer] = cls
    return cls


def dump_handle(handle: Handle) -> dict[str, Any]:
    return {"serializer": handle.serializer, "version": handle.version, "data": handle.encode()}


def load_handle(doc: dict[str, Any], *, sink_uid: str | None = None) -> Handle:
    """Load a handle document written by :func:`dump_handle` (any supported version)."""
    name = doc.get("serializer")
    cls = _REGISTRY.get(str(name))
    if cls is None:
        raise HandleFormatError(
            f"unknown handle serializer {name!r}: import the connector that wrote it "
            f"(known: {sorted(_REGISTRY)})",
            sink_uid=sink_uid,
        )
    try:
        return cls.decode(int(doc["version"]), dict(doc["data"]))
    except HandleFormatError as err:
        raise err.with_context(sink_uid=sink_uid) from None
    except (KeyError, TypeError, ValueError) as err:
        raise HandleFormatError(
            f"handle of serializer {name!r} version {doc.get('version')} is malformed: {err}",
            sink_uid=sink_uid,
        ) from err
