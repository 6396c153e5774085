"""The txsink log: the durable record of every epoch's decision.

Layout (human-readable JSON, each record written once, never rewritten)::

    meta.json                                   format version, app id
    epochs/<epoch:020d>/claim-<round:06d>.json  a driver claimed this round of the epoch
    epochs/<epoch:020d>/decision-<round>.json   "decision" (all handles) or "void" (fenced)
    epochs/<epoch:020d>/committed.json          every handle of the decision is committed
    epochs/<epoch:020d>/blocked-<n:06d>.json    attempt n to commit the decision was refused
                                                for good (EpochBlockedError): reason and fix
    lease/<generation:012d>.json                the driver lease (:mod:`txsink.protocol.lease`)

Why rounds: a replay of an epoch after a crash is a new *round* with fresh
transaction names, claimed with create-if-absent so two drivers never share
one. At most one round of an epoch can hold a decision: a driver deciding
round ``k`` first *voids* rounds ``0..k-1`` (create-if-absent), and recovery
voids a round before aborting its lingering transactions. A void can never be
overwritten by a decision nor the reverse, so a zombie driver that prepared
round ``j`` either decided before it was voided (and its decision is
committed by whoever comes next) or can never decide. This is what makes
aborting a lingering transaction safe.

A *blocked* epoch is decided, not committed, and has ``blocked-*`` records: a commit
of it failed with :class:`~txsink.errors.EpochBlockedError` (the target refuses it
until an operator changes something). Each refused attempt adds a record, so the
first one says since when and their count how often; the committed mark ends the
block (the records stay as history until the epoch is pruned). Older txsinks ignore
these records (and the ``lease/`` folder), so they read such a log as before.

Every record is created with an atomic create-if-absent on the
:class:`LogStore`; a store that cannot do that cannot hold a txsink log.

Versions: ``meta.json`` carries the log format version
(:data:`LOG_FORMAT_VERSION`), every other record its own ``"version"``
(:data:`RECORD_VERSION`). Reading is strict: a record of a newer version than
this txsink reads raises :class:`~txsink.errors.LogError` naming the record,
both versions and the fix (upgrade txsink), never a guess; a newer txsink
reads every older version. ``tests/golden/`` pins the released formats.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from txsink.errors import CheckpointMismatchError, LogError
from txsink.kit.jsonrows import dumps_record
from txsink.protocol.blocks import BLOCK as _BLOCK
from txsink.protocol.blocks import EpochBlock, block_doc, summarize
from txsink.schema import SchemaChange
from txsink.store import FileStore, LogStore, open_store

__all__ = [
    "LOG_FORMAT_VERSION",
    "RECORD_VERSION",
    "SCHEMA_PREFIX",
    "CommitRecord",
    "EpochBlock",
    "EpochDecision",
    "EpochState",
    "FileStore",
    "LogStore",
    "TxLog",
    "open_log",
]

LOG_FORMAT_VERSION = 1
#: The newest version of the claim, decision, void and committed records this txsink
#: reads (it reads every version from 1 up to this one). It writes version 1, but for a
#: decision that changes a target's schema (issue #41): version 2, so an older txsink
#: refuses that one record rather than commit its rows without the change.
RECORD_VERSION = 2
_EPOCHS = "epochs/"
#: The schema changes of pruned epochs, one record each: the history outlives the epochs.
SCHEMA_PREFIX = "schema/"
_KINDS = ("decision", "void")


def open_log(
    location: str | os.PathLike[str] | LogStore | TxLog,
    **store_options: Any,
) -> TxLog:
    """Open the txsink log at a filesystem path, a URL or a store (an open :class:`TxLog`
    is returned as it is, so every API can take any of these).

    A URL's scheme names the store: ``file://`` or none is the local filesystem; others
    are registered by connectors (``s3://`` by the S3 connector), and ``store_options``
    go to that store (e.g. ``client_options=`` for S3).
    """
    if isinstance(location, TxLog):
        if store_options:
            raise ValueError("open_log: store options apply to a location, not an open log")
        return location
    return TxLog(open_store(location, **store_options))


def _epoch_prefix(epoch: int) -> str:
    return f"{_EPOCHS}{epoch:020d}/"


@dataclass(frozen=True)
class EpochDecision:
    """The commit point of an epoch: every handle of every sink, as JSON documents."""

    epoch: int
    round: int
    handles: dict[str, list[dict[str, Any]]]
    decided_at: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    #: sink uid -> the schema change this epoch applies (JSON: :class:`SchemaChange`).
    schema: dict[str, dict[str, Any]] = field(default_factory=dict)

    def txn_names(self) -> set[str]:
        return {doc["data"]["txn"] for docs in self.handles.values() for doc in docs}

    def schema_change(self, uid: str) -> SchemaChange | None:
        """The change this decision records for sink ``uid`` (``None``: none)."""
        doc = self.schema.get(uid)
        return None if doc is None else SchemaChange.from_json(uid, doc)


@dataclass(frozen=True)
class CommitRecord:
    epoch: int
    round: int
    committed_at: float
    not_restored: tuple[str, ...] = ()


@dataclass(frozen=True)
class EpochState:
    """What the log knows of one epoch (for status and recovery)."""

    epoch: int
    rounds: tuple[int, ...]
    decision: EpochDecision | None
    voided: tuple[int, ...]
    committed: CommitRecord | None
    blocked: EpochBlock | None = None

    @property
    def status(self) -> str:
        if self.committed is not None:
            return "committed"
        if self.decision is not None:
            return "blocked" if self.blocked is not None else "decided"
        if self.rounds and len(self.voided) >= len(self.rounds):
            return "aborted"
        return "open"


class TxLog:
    """The protocol's records on top of a :class:`LogStore` (one app per log)."""

    def __init__(self, store: LogStore) -> None:
        self.store = store

    @property
    def location(self) -> str:
        return self.store.location

    # -- meta ------------------------------------------------------------------------

    def meta(self) -> dict[str, Any] | None:
        raw = self.store.read("meta.json")
        if raw is None:
            return None
        doc = self.parse_record("meta.json", raw)
        version = doc.get("version")
        if doc.get("format") != "txsink-log":
            raise LogError(
                f"{self.location}/meta.json has format {doc.get('format')!r}: this is not a "
                "txsink log (expected format 'txsink-log'); point --log / log= at the "
                "pipeline's txsink log folder or URL"
            )
        if type(version) is not int or not 1 <= version <= LOG_FORMAT_VERSION:
            raise LogError(self._version_message("meta.json", "log format", version))
        return doc

    def bind_app(self, app_id: str) -> None:
        """Tie the log to ``app_id`` on first use; refuse a log that belongs to another app."""
        doc = {
            "format": "txsink-log",
            "version": LOG_FORMAT_VERSION,
            "app_id": app_id,
            "created_at": time.time(),
        }
        self.store.create("meta.json", dumps_record(doc))
        meta = self.meta()
        if meta is None or meta.get("app_id") != app_id:
            raise self.app_mismatch(None if meta is None else meta.get("app_id"), app_id)

    def app_mismatch(self, owner: object, app_id: str) -> CheckpointMismatchError:
        """The error for a query of app ``app_id`` on this log, which belongs to ``owner``."""
        return CheckpointMismatchError(
            f"the txsink log at {self.location} belongs to app {owner!r}, but this query "
            f"runs as app {app_id!r}. The Spark checkpoint location (and so the query id) "
            "changed while the txsink log was kept. Use a new txsink log for a new "
            f"checkpoint, or pass app_id={owner!r} to keep writing this log's history"
        )

    # -- epochs ------------------------------------------------------------------------

    def claim_round(self, epoch: int) -> int:
        """Claim the next unused round of ``epoch`` for this driver."""
        rounds = self._rounds(epoch)
        nxt = (max(rounds) + 1) if rounds else 0
        info = {"epoch": epoch, "host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
        while True:
            key = f"{_epoch_prefix(epoch)}claim-{nxt:06d}.json"
            doc = {"version": 1, "round": nxt, **info}
            if self.store.create(key, dumps_record(doc)):
                return nxt
            nxt += 1

    def claim(self, epoch: int, round_: int) -> bool:
        """Claim round ``round_`` of ``epoch`` exactly (tasks that already prepared under
        it: the Data Source path); False if it was claimed before."""
        info = {"epoch": epoch, "host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
        doc = {"version": 1, "round": round_, **info}
        return self.store.create(
            f"{_epoch_prefix(epoch)}claim-{round_:06d}.json", dumps_record(doc)
        )

    def decide(
        self,
        epoch: int,
        round_: int,
        handles: dict[str, list[dict[str, Any]]],
        stats: dict[str, Any] | None = None,
        schema: dict[str, dict[str, Any]] | None = None,
    ) -> bool:
        """Create round ``round_``'s decision; False if that round was voided first.
        ``schema``: sink uid -> the schema change the epoch applies (version 2)."""
        doc: dict[str, Any] = {
            "version": 2 if schema else 1,
            "kind": "decision",
            "epoch": epoch,
            "round": round_,
            "decided_at": time.time(),
            "handles": handles,
            "stats": stats or {},
        }
        if schema:
            doc["schema"] = schema
        return self.store.create(self._decision_key(epoch, round_), dumps_record(doc))

    def void(self, epoch: int, round_: int, reason: str) -> EpochDecision | None:
        """Make sure round ``round_`` can never be decided.

        Returns that round's decision if it was decided first (the void lost).
        """
        doc = {
            "version": 1,
            "kind": "void",
            "epoch": epoch,
            "round": round_,
            "reason": reason,
            "at": time.time(),
        }
        key = self._decision_key(epoch, round_)
        if self.store.create(key, dumps_record(doc)):
            return None
        return self._read_decision(key)

    def decision(self, epoch: int) -> EpochDecision | None:
        """The decision of ``epoch``, if any round of it was decided."""
        for key in self.store.list(_epoch_prefix(epoch)):
            if key.rsplit("/", 1)[1].startswith("decision-"):
                dec = self._read_decision(key)
                if dec is not None:
                    return dec
        return None

    def committed(self, epoch: int) -> CommitRecord | None:
        key = f"{_epoch_prefix(epoch)}committed.json"
        raw = self.store.read(key)
        if raw is None:
            return None
        doc = self._record(key, raw)
        return CommitRecord(
            epoch=int(doc["epoch"]),
            round=int(doc["round"]),
            committed_at=float(doc["committed_at"]),
            not_restored=tuple(doc.get("not_restored", ())),
        )

    def mark_committed(self, epoch: int, round_: int, not_restored: tuple[str, ...] = ()) -> None:
        doc = {
            "version": 1,
            "epoch": epoch,
            "round": round_,
            "committed_at": time.time(),
            "not_restored": list(not_restored),
        }
        self.store.create(f"{_epoch_prefix(epoch)}committed.json", dumps_record(doc))

    def record_block(
        self, epoch: int, round_: int, *, sink_uid: str, shard: int | None, reason: str, fix: str
    ) -> int:
        """Record that a commit attempt of decided ``epoch`` was refused for good; returns
        the attempt's number (1 for the first)."""
        prefix = _epoch_prefix(epoch)
        while True:
            done = [k for k in self.store.list(prefix) if k.rsplit("/", 1)[1].startswith(_BLOCK)]
            attempt = len(done) + 1
            doc = block_doc(
                epoch,
                round_=round_,
                attempt=attempt,
                sink_uid=sink_uid,
                shard=shard,
                reason=reason,
                fix=fix,
            )
            doc["version"] = 1
            if self.store.create(f"{prefix}{_BLOCK}{attempt:06d}.json", dumps_record(doc)):
                return attempt

    def block(self, epoch: int) -> EpochBlock | None:
        """Why decided ``epoch`` is blocked (``None``: never refused for good)."""
        keys = self.store.list(_epoch_prefix(epoch))
        return self._block_of(epoch, [k for k in keys if k.rsplit("/", 1)[1].startswith(_BLOCK)])

    def _block_of(self, epoch: int, keys: list[str]) -> EpochBlock | None:
        raws = [(key, self.store.read(key)) for key in sorted(keys)]
        return summarize(epoch, [self._record(key, raw) for key, raw in raws if raw is not None])

    def epochs(self) -> list[int]:
        """Every epoch the log holds records for, ascending."""
        seen = {self._epoch_of(key) for key in self.store.list(_EPOCHS)}
        return sorted(e for e in seen if e is not None)

    def state(self, epoch: int) -> EpochState:
        rounds, voided = [], []
        decision = None
        committed = None
        blocks: list[str] = []
        for key in self.store.list(_epoch_prefix(epoch)):
            name = key.rsplit("/", 1)[1]
            if name.startswith(_BLOCK):
                blocks.append(key)
            elif name.startswith("claim-"):
                raw = self.store.read(key)
                if raw is not None:
                    self._record(key, raw)  # nothing in a claim is used: only its version
                rounds.append(int(name[6:12]))
            elif name.startswith("decision-"):
                raw = self.store.read(key)
                if raw is None:  # deleted meanwhile (prune)
                    continue
                doc = self._record(key, raw)
                if doc.get("kind") == "void":
                    voided.append(int(doc["round"]))
                else:
                    decision = self._decision_from(doc)
            elif name == "committed.json":
                committed = self.committed(epoch)
        blocked = self._block_of(epoch, blocks) if committed is None else None
        return EpochState(
            epoch, tuple(sorted(rounds)), decision, tuple(sorted(voided)), committed, blocked
        )

    def states(self) -> list[EpochState]:
        return [self.state(e) for e in self.epochs()]

    def last_committed(self) -> int | None:
        for epoch in reversed(self.epochs()):
            if self.store.read(f"{_epoch_prefix(epoch)}committed.json") is not None:
                return epoch
        return None

    def pending(self) -> list[EpochDecision]:
        """Decided epochs without their committed mark, ascending."""
        out = []
        for epoch in self.epochs():
            if self.store.read(f"{_epoch_prefix(epoch)}committed.json") is not None:
                continue
            dec = self.decision(epoch)
            if dec is not None:
                out.append(dec)
        return out

    def prune(self, keep: int) -> list[int]:
        """Delete committed epochs older than the newest ``keep`` epochs; returns them."""
        if keep < 1:
            raise ValueError("retain_epochs must be >= 1")
        epochs = self.epochs()
        last = self.last_committed()
        if last is None:
            return []
        removed = []
        for epoch in epochs[: max(0, len(epochs) - keep)]:
            if epoch >= last:
                break
            state = self.state(epoch)
            if state.status not in ("committed", "aborted"):
                continue  # keep anything recovery may still need
            if state.decision is not None and state.decision.schema:  # the schema history
                dec = state.decision
                doc = {
                    "version": 1,
                    "epoch": epoch,
                    "decided_at": dec.decided_at,
                    "schema": dec.schema,
                }
                self.store.create(f"{SCHEMA_PREFIX}{epoch:020d}.json", dumps_record(doc))
            for key in self.store.list(_epoch_prefix(epoch)):
                self.store.delete(key)
            removed.append(epoch)
        return removed

    # -- helpers ---------------------------------------------------------------------

    def _rounds(self, epoch: int) -> list[int]:
        return [
            int(key.rsplit("/", 1)[1][6:12])
            for key in self.store.list(_epoch_prefix(epoch))
            if key.rsplit("/", 1)[1].startswith("claim-")
        ]

    @staticmethod
    def _decision_key(epoch: int, round_: int) -> str:
        return f"{_epoch_prefix(epoch)}decision-{round_:06d}.json"

    @staticmethod
    def _epoch_of(key: str) -> int | None:
        parts = key.split("/")
        if len(parts) >= 3 and parts[1].isdigit():
            return int(parts[1])
        return None

    def _read_decision(self, key: str) -> EpochDecision | None:
        raw = self.store.read(key)
        if raw is None:
            return None
        doc = self._record(key, raw)
        return None if doc.get("kind") == "void" else self._decision_from(doc)

    @staticmethod
    def _decision_from(doc: dict[str, Any]) -> EpochDecision:
        return EpochDecision(
            epoch=int(doc["epoch"]),
            round=int(doc["round"]),
            handles={uid: list(docs) for uid, docs in doc["handles"].items()},
            decided_at=float(doc.get("decided_at", 0.0)),
            stats=dict(doc.get("stats", {})),
            schema=dict(doc.get("schema", {})),
        )

    def _record(self, key: str, raw: bytes) -> dict[str, Any]:
        """Parse an epoch record and check its version (and a decision file's kind)."""
        doc = self.parse_record(key, raw)
        version = doc.get("version")
        if type(version) is not int or not 1 <= version <= RECORD_VERSION:
            raise LogError(self._version_message(key, "record", version))
        if key.rsplit("/", 1)[-1].startswith("decision-") and doc.get("kind") not in _KINDS:
            raise LogError(
                f"txsink log record {key} at {self.location} is of kind {doc.get('kind')!r} "
                f"(version {version}); this txsink reads kinds {list(_KINDS)}: the log was "
                "written by a newer txsink or edited by hand. Upgrade txsink to the release "
                "that wrote it"
            )
        return doc

    def _version_message(self, key: str, what: str, version: object) -> str:
        reads = LOG_FORMAT_VERSION if what == "log format" else RECORD_VERSION
        head = (
            f"txsink log record {key} at {self.location} has {what} version {version!r}; "
            f"this txsink reads {what} version(s) 1 to {reads}"
        )
        if type(version) is int and version > reads:
            return (
                f"{head}. It was written by a newer txsink: upgrade txsink to that release "
                "(or newer) to run, recover or inspect this pipeline, or restore the pipeline "
                "with the txsink release that wrote the log. Do not edit or delete the record"
            )
        return (
            f"{head}. The version is missing or unknown: the log is damaged or was edited "
            "by hand; restore it from a backup or a savepoint"
        )

    def parse_record(self, key: str, raw: bytes) -> dict[str, Any]:
        """One record's JSON object (``LogError`` naming the record if it is not one)."""
        try:
            doc = json.loads(raw)
        except ValueError as err:
            raise LogError(
                f"txsink log record {key} at {self.location} is not JSON: {err}"
            ) from err
        if not isinstance(doc, dict):
            raise LogError(f"txsink log record {key} at {self.location} is not a JSON object")
        return doc
