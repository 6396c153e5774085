"""Handles: serialisable descriptions of prepared transactions.

A handle is what a partition task returns from ``prepare`` and what the
coordinator writes into the epoch's decision record; from it alone, on any
machine and after any crash, the connector must be able to commit or abort.

Handles are frozen dataclasses written as JSON under a *serializer name* and
*version*::

    {"serializer": "files.staged", "version": 1, "data": {...}}

The core adds the rows' digest (:class:`txsink.audit.digest.Digest`) next to ``data``, as
``"evidence"``: what the pre-commit handed the sink, for ``txsink audit``. It is not the
connector's: :meth:`Handle.encode` leaves it out, and a txsink older than the audit
ignores it, so it changes no handle's version.

Evolution rule (the TypeSerializerSnapshot discipline): a connector that bumps
``version`` keeps reading every older version in :meth:`Handle.decode`, or
raises :class:`~txsink.errors.HandleFormatError` naming both versions.

Reading is strict, because a handle is what recovery commits or aborts: a
guess at an unknown layout could commit the wrong thing or lose rows. An
unknown serializer, or a version this txsink does not read (typically one
written by a newer txsink), fails in :func:`load_handle` with a
:class:`~txsink.errors.HandleFormatError` that names the sink uid, the
serializer, the version found, the versions this txsink reads and the fix,
before the connector's ``decode`` sees any data. The released formats are
pinned by golden logs (``tests/golden/``).
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
    #: The digest of the rows the sink was handed (:meth:`txsink.audit.digest.Digest.to_json`),
    #: set by the core, never by a connector; ``None`` in handles decided before the audit.
    evidence: dict[str, Any] | None = dataclasses.field(
        default=None, kw_only=True, compare=False, repr=False
    )

    @classmethod
    def readable_versions(cls) -> tuple[int, ...]:
        """The versions :meth:`decode` reads: by the evolution rule, 1 up to :attr:`version`.

        Override only if a connector ever drops an old version (it then says so here, and
        :func:`load_handle` names the versions it still reads).
        """
        return tuple(range(1, cls.version + 1))

    def encode(self) -> dict[str, Any]:
        """The ``data`` part of the JSON document."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del data["evidence"]  # the envelope's, not the connector's
        data["txn"] = str(self.txn)
        return data

    @classmethod
    def decode(cls, version: int, data: dict[str, Any]) -> Self:
        """Rebuild a handle written by ``version`` of this serializer."""
        if version != cls.version:
            raise HandleFormatError(_version_message(cls, version, None))
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
    doc = {"serializer": handle.serializer, "version": handle.version, "data": handle.encode()}
    if handle.evidence is not None:
        doc["evidence"] = handle.evidence
    return doc


def load_handle(doc: dict[str, Any], *, sink_uid: str | None = None) -> Handle:
    """Load a handle document written by :func:`dump_handle` (any supported version).

    Strict: an unknown serializer, a version outside :meth:`Handle.readable_versions`
    or a malformed document raises :class:`~txsink.errors.HandleFormatError` naming
    ``sink_uid``, the serializer and the versions; nothing is guessed.
    """
    if not isinstance(doc, dict):
        raise HandleFormatError(
            f"{_whose(sink_uid)}handle document is a {type(doc).__name__}, not a JSON object "
            '{"serializer", "version", "data"}: the txsink log is damaged',
            sink_uid=sink_uid,
        )
    name = doc.get("serializer")
    cls = _REGISTRY.get(str(name))
    if cls is None:
        raise HandleFormatError(
            f"{_whose(sink_uid)}unknown handle serializer {name!r} (version "
            f"{doc.get('version')!r}); this txsink reads {sorted(_REGISTRY)}: import the "
            "connector that wrote it (txsink.connectors.<name>), or upgrade txsink to the "
            "release that wrote this log",
            sink_uid=sink_uid,
        )
    version = doc.get("version")
    if type(version) is not int or version not in cls.readable_versions():
        raise HandleFormatError(_version_message(cls, version, sink_uid), sink_uid=sink_uid)
    data = doc.get("data")
    if not isinstance(data, dict):
        raise HandleFormatError(
            f"{_whose(sink_uid)}handle of serializer {name!r} version {version} has no 'data' "
            "object: the txsink log is damaged",
            sink_uid=sink_uid,
        )
    try:
        handle = cls.decode(version, dict(data))
        evidence = doc.get("evidence")
        return handle if evidence is None else dataclasses.replace(handle, evidence=evidence)
    except HandleFormatError as err:
        raise err.with_context(sink_uid=sink_uid) from None
    except (KeyError, TypeError, ValueError) as err:
        raise HandleFormatError(
            f"{_whose(sink_uid)}handle of serializer {name!r} version {version} is malformed: "
            f"{err!r}; the txsink log is damaged or was edited by hand",
            sink_uid=sink_uid,
        ) from err


def _whose(sink_uid: str | None) -> str:
    return f"sink {sink_uid}: " if sink_uid else ""


def _version_message(cls: type[Handle], version: object, sink_uid: str | None) -> str:
    """Why a handle's version cannot be read, and what to do (newer vs. unknown)."""
    reads = ", ".join(str(v) for v in cls.readable_versions())
    head = (
        f"{_whose(sink_uid)}handle serializer {cls.serializer!r} version {version!r} cannot be "
        f"read by this txsink (it reads version(s) {reads} of {cls.serializer!r})"
    )
    if type(version) is int and version > cls.version:
        return (
            f"{head}: the log was written by a newer txsink. Upgrade txsink to that release "
            "(or newer) before running or recovering the pipeline; do not abort by hand, the "
            "handle may belong to a decided epoch"
        )
    return (
        f"{head}: the version is unknown or no longer supported. Recover the log with the "
        "txsink release that wrote it (txsink recover), then upgrade"
    )
