"""Which records of a txsink log a savepoint holds, in which order they are restored, and
how they are written into a log location.

Canonical (see :mod:`txsink.ops.savepoint`): the committed epochs' deciding round and
committed mark, and the aborted epochs' claims and voids; a log with an epoch decided
but not committed, an open epoch or an unfinished uid rename is refused. Every record is
written with create-if-absent, and an existing record must already hold the same bytes:
two writers into one location are caught, never merged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from txsink.errors import SavepointError
from txsink.ops.savepoint_manifest import CHECKPOINT_PREFIX, MANIFEST, RESTORED_MARKER, sha
from txsink.protocol.log import SCHEMA_PREFIX, FileStore, TxLog
from txsink.store import LogStore

__all__ = [
    "canonical_records",
    "create_exact",
    "is_empty",
    "log_keys",
    "refuse_unfinished_rename",
    "restore_order",
]

#: Key prefixes a txsink log (or a savepoint) may hold; FileStore.list needs a prefix.
_PREFIXES = ("epochs/", "upgrades/", SCHEMA_PREFIX, CHECKPOINT_PREFIX)
_ROOT_KEYS = ("meta.json", MANIFEST, RESTORED_MARKER)


def canonical_records(
    log: TxLog, meta_raw: bytes
) -> tuple[list[tuple[str, bytes]], list[int], list[str]]:
    """The records that describe the committed history; refuses unfinished epochs.

    Returns the records (key, bytes), the committed epochs and the sink uids of their
    decisions.
    """
    decided: list[int] = []
    open_: list[str] = []
    records: list[tuple[str, bytes]] = [("meta.json", meta_raw)]
    epochs: list[int] = []
    sinks: set[str] = set()
    for state in log.states():
        prefix = f"epochs/{state.epoch:020d}/"
        if state.committed is not None:
            keys = [f"{prefix}committed.json"]
            if state.decision is not None:
                keys.insert(0, f"{prefix}decision-{state.decision.round:06d}.json")
                sinks.update(state.decision.handles)
            epochs.append(state.epoch)
        elif state.decision is not None:
            decided.append(state.epoch)
            continue
        else:
            live = sorted(set(state.rounds) - set(state.voided))
            if live:
                open_.append(_describe_claim(log, state.epoch, live[0]))
                continue
            # Aborted: every round voided. Keep claims and voids (see the module doc).
            keys = [
                k
                for k in log.store.list(prefix)
                if k.rsplit("/", 1)[1].startswith(("claim-", "decision-"))
            ]
        for key in keys:
            data = log.store.read(key)
            if data is None:
                raise SavepointError(
                    f"txsink log record {key} at {log.location} vanished while the savepoint "
                    "was taken: is a query (or a prune) running? Stop it and try again"
                )
            records.append((key, data))
    for key in log.store.list(SCHEMA_PREFIX):  # the schema history of pruned epochs
        data = log.store.read(key)
        if data is not None:
            records.append((key, data))
    if decided:
        raise SavepointError(
            f"the txsink log at {log.location} has epoch(s) {decided} decided but not yet "
            "committed, so it is not at a fully committed epoch: restart the query so its "
            "recovery finishes them (or run `txsink recover`), stop it, then take the "
            "savepoint",
            epoch=decided[0],
        )
    if open_:
        raise SavepointError(
            f"the txsink log at {log.location} has open epoch(s) (claimed, neither decided "
            f"nor voided): {'; '.join(open_)}. A query may be running: stop it first. If it "
            "crashed during that epoch's pre-commit, restart it once (its recovery voids "
            "the round) and stop it, then take the savepoint"
        )
    return records, epochs, sorted(sinks)


def _describe_claim(log: TxLog, epoch: int, round_: int) -> str:
    raw = log.store.read(f"epochs/{epoch:020d}/claim-{round_:06d}.json")
    doc: dict[str, Any] = {}
    if raw is not None:
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = {}
    who = f"host {doc.get('host', '?')} pid {doc.get('pid', '?')}"
    return f"epoch {epoch} round {round_} claimed by {who}"


def refuse_unfinished_rename(log: TxLog) -> None:
    """Refuse a log whose ``txsink state rename-uid`` did not finish."""
    pending = log.store.list("upgrades/")
    if pending:
        raise SavepointError(
            f"the txsink log at {log.location} has an unfinished state upgrade ({pending[0]}): "
            "run the same `txsink state rename-uid` command again to finish it, then take "
            "the savepoint"
        )


def restore_order(
    entries: Sequence[dict[str, Any]], store: LogStore, location: str
) -> list[tuple[str, bytes]]:
    """The manifest's records in restore order, read from the savepoint at ``location``.

    The meta record first, then epochs from the newest down, each epoch's committed mark
    before its claims and decision (why: :func:`txsink.ops.savepoint.restore_savepoint`).
    """

    def rank(key: str) -> tuple[int, int, int, str]:
        if key == "meta.json":
            return (0, 0, 0, key)
        if key.startswith(SCHEMA_PREFIX):
            return (2, 0, 0, key)
        epoch = int(key.split("/")[1])
        name = key.rsplit("/", 1)[1]
        kind = 0 if name == "committed.json" else 1 if name.startswith("claim-") else 2
        return (1, -epoch, kind, name)

    out = []
    for entry in sorted(entries, key=lambda e: rank(str(e["key"]))):
        data = store.read(entry["key"])
        if data is None or sha(data) != entry["sha256"]:
            raise SavepointError(
                f"savepoint record {entry['key']} at {location} changed during the restore"
            )
        out.append((str(entry["key"]), data))
    return out


def log_keys(store: LogStore) -> list[str]:
    """Every key a txsink log or a savepoint may hold that ``store`` has."""
    keys = [key for key in _ROOT_KEYS if store.read(key) is not None]
    for prefix in _PREFIXES:
        keys.extend(store.list(prefix))
    return keys


def is_empty(store: LogStore) -> bool:
    if isinstance(store, FileStore):
        return not store.root.exists() or not any(store.root.iterdir())
    return not log_keys(store)


def create_exact(store: LogStore, key: str, data: bytes, what: str) -> int:
    """Create ``key``; an existing record must hold exactly ``data``. 1 if created."""
    if store.create(key, data):
        return 1
    if store.read(key) != data:
        raise SavepointError(
            f"{what}: {store.location}/{key} was written by someone else meanwhile (another "
            f"{what} or a running query into the same location): use a location nobody else "
            "writes to"
        )
    return 0
