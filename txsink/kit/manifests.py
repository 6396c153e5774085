"""Epoch manifests: the record, written last, that makes an epoch's files visible to readers.

Used by the files and S3 connectors. A manifest is one JSON object per (sink uid, epoch)
under ``_manifests/<uid>-<epoch:020d>.json`` of the output, written through a
:class:`~txsink.store.LogStore` rooted at the output (``FileStore`` on a filesystem, the
S3 connector's conditional-PUT store on a bucket), so there is one create-if-absent per
kind of storage.

Writing (:func:`write`) is create-if-absent, and an existing manifest is compared: an
identical one (everything but ``committed_at``) is a recovery re-run and is accepted, any
other one is another writer's epoch of the same uid and is refused with a
:class:`~txsink.errors.CommitError`, never silently kept or replaced.

A manifest also records the output's schema after its epoch (``"schema"``; which one, and
reading epochs of different schemas: :mod:`txsink.kit.evolving`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from txsink.errors import CommitError, StateError
from txsink.schema import schema_to_json
from txsink.store import LogStore

__all__ = [
    "FOLDER",
    "check_renamed",
    "document",
    "encode",
    "key",
    "migrate",
    "owner",
    "read_committed",
    "read_manifests",
    "renamed",
    "write",
]

#: The manifests' folder (key prefix) under the output.
FOLDER = "_manifests"
#: How many of the newest manifests :func:`owner` looks at.
_OWNER_LOOKBACK = 10


def key(uid: str, epoch: int) -> str:
    """The manifest's key relative to the output: ``_manifests/<uid>-<epoch:020d>.json``."""
    return f"{FOLDER}/{uid}-{epoch:020d}.json"


def document(
    *,
    uid: str,
    epoch: int,
    app_id: str | None,
    format: str,
    listing: str,
    entries: Iterable[Mapping[str, Any]],
    sort_by: str,
    extra: Mapping[str, Any] | None = None,
    schema: pa.Schema | None = None,
    committed_at: float,
) -> dict[str, Any]:
    """The manifest of one epoch: its ``entries`` (files or objects) under ``listing``.

    Entries are sorted by their ``sort_by`` field, so a re-run builds the same document;
    ``rows`` is their sum; ``extra`` fields follow ``format``; ``schema`` is the target's
    schema after the epoch (:mod:`txsink.kit.evolving`), omitted when unknown.
    """
    items = sorted((dict(e) for e in entries), key=lambda e: str(e[sort_by]))
    return {
        "version": 1,
        "app_id": app_id,
        "uid": uid,
        "epoch": epoch,
        "format": format,
        **(extra or {}),
        **({"schema": schema_to_json(schema)} if schema is not None else {}),
        "rows": sum(int(e["rows"]) for e in items),
        listing: items,
        "committed_at": committed_at,
    }


def _comparable(doc: Mapping[str, Any], like: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``doc`` without its time; without its schema too when ``like`` (the manifest found)
    has none: an older txsink wrote it before a crash, and this one's recovery re-runs it."""
    skip = {"committed_at"} | ({"schema"} if like is not None and "schema" not in like else set())
    return {k: v for k, v in doc.items() if k not in skip}


def encode(doc: Mapping[str, Any]) -> bytes:
    """The bytes of a manifest as stored (indented JSON, one trailing newline)."""
    return (json.dumps(doc, indent=1) + "\n").encode()


def write(
    store: LogStore,
    doc: Mapping[str, Any],
    *,
    where: str,
    place: str,
    context: Mapping[str, Any],
) -> None:
    """Create the manifest ``doc`` unless it exists; an existing one must say the same.

    ``where`` names the manifest for people (a path or an ``s3://`` URL), ``place`` the
    output ("prefix", "output folder"), ``context`` the error context (sink uid, connector).

    Raises:
        CommitError: a different manifest of this uid and epoch exists: another query
            wrote this epoch here. Nothing is overwritten.
    """
    name = key(str(doc["uid"]), int(doc["epoch"]))
    if store.create(name, encode(doc)):
        return
    # Written before (recovery after a crash, or a retried write): it must say the same.
    raw = store.read(name)
    existing = json.loads(raw) if raw is not None else None
    if existing is not None and _comparable(existing) == _comparable(doc, like=existing):
        return
    epoch, uid = doc["epoch"], doc["uid"]
    listing = "objects" if "objects" in doc else "data files"
    raise CommitError(
        f"the manifest {where} of epoch {epoch} already exists and lists other {listing}: "
        f"another query wrote epoch {epoch} of sink uid {uid!r} under this {place}. Give each "
        f"query its own {place} or sink uid; move the other query's epochs away only if they "
        "are not output you need",
        **{**context, "phase": "commit", "epoch": epoch},
    )


def read_manifests(store: LogStore, uid: str | None = None) -> list[dict[str, Any]]:
    """The manifests under ``store`` by (epoch, uid), optionally of one sink ``uid``."""
    docs = []
    for name in store.list(f"{FOLDER}/{uid + '-' if uid else ''}"):
        if not name.endswith(".json"):
            continue
        raw = store.read(name)
        if raw is None:  # deleted meanwhile (a rename-uid)
            continue
        doc = json.loads(raw)
        if uid is None or doc["uid"] == uid:
            docs.append(doc)
    return sorted(docs, key=lambda d: (d["epoch"], d["uid"]))


def read_committed(
    manifests: Sequence[Mapping[str, Any]],
    read_entry: Callable[[Mapping[str, Any], Mapping[str, Any]], pa.Table],
    listing: str,
) -> pa.Table:
    """Every row of the whole committed epochs ``manifests`` list, with an ``_epoch`` column.

    ``read_entry(manifest, entry)`` reads one file/object of the manifest's ``listing``.
    """
    tables = []
    for doc in manifests:
        for entry in doc[listing]:
            table = read_entry(doc, entry)
            tables.append(
                table.append_column("_epoch", pa.array([doc["epoch"]] * len(table), pa.int64()))
            )
    if not tables:
        return pa.table({"_epoch": pa.array([], pa.int64())})
    return pa.concat_tables(tables, promote_options="permissive")


def owner(store: LogStore, uid: str) -> str | None:
    """The app that wrote the newest epochs of ``uid`` here (None: none, or not said).

    A new query (new checkpoint and log) numbers its epochs from 0 again, so its files
    would collide with another app's: the sinks refuse to start then. Only the newest
    few manifests are read, to keep a start cheap on a long history.
    """
    names = [n for n in store.list(f"{FOLDER}/{uid}-") if n.endswith(".json")]
    for name in sorted(names, reverse=True)[:_OWNER_LOOKBACK]:
        raw = store.read(name)
        doc = json.loads(raw) if raw is not None else {}
        if doc.get("uid") == uid and doc.get("app_id") is not None:
            return str(doc["app_id"])
    return None


def recorded_epoch(store: LogStore, uid: str, app_id: str) -> int | None:
    """The newest epoch of ``uid`` whose manifest names ``app_id`` (among the newest few,
    as :func:`owner`): what the target remembers of that app."""
    names = [n for n in store.list(f"{FOLDER}/{uid}-") if n.endswith(".json")]
    for name in sorted(names, reverse=True)[:_OWNER_LOOKBACK]:
        raw = store.read(name)
        doc = json.loads(raw) if raw is not None else {}
        if doc.get("uid") == uid and doc.get("app_id") == app_id:
            return int(doc["epoch"])
    return None


def renamed(raw: bytes, old: str, new: str) -> bytes:
    """A manifest of uid ``old`` rewritten for uid ``new`` (``txsink state rename-uid``)."""
    doc = json.loads(raw)
    doc["uid"] = new
    doc["renamed_from"] = old
    return encode(doc)


def check_renamed(existing: bytes, wanted: bytes, where: str, new: str) -> None:
    """An existing new-uid manifest is fine only if an earlier run of this rename wrote it."""
    have, want = json.loads(existing), json.loads(wanted)
    if have.get("renamed_from") != want.get("renamed_from") or have.get("epoch") != want.get(
        "epoch"
    ):
        raise StateError(
            f"rename-uid: {where} already exists and was not written by this rename: the "
            f"target already holds epochs of uid {new!r}. Pick another new uid",
            sink_uid=new,
        )


def migrate(
    store: LogStore, old: str, new: str, *, dry_run: bool, where: Callable[[str], str]
) -> int:
    """Move the manifests of uid ``old`` to uid ``new``: create the new one, then delete.

    Idempotent: a re-run after a crash finds its own earlier copies (``renamed_from``).
    ``where(key)`` names a key for people. Returns how many manifests (would) move.
    """
    moved = 0
    for name in store.list(f"{FOLDER}/{old}-"):
        raw = store.read(name)
        if raw is None or not name.endswith(".json") or json.loads(raw).get("uid") != old:
            continue
        moved += 1
        if dry_run:
            continue
        target = f"{FOLDER}/{new}-{name[len(FOLDER) + len(old) + 2 :]}"
        body = renamed(raw, old, new)
        if not store.create(target, body):
            existing = store.read(target)
            if existing is not None:
                check_renamed(existing, body, where(target), new)
        store.delete(name)
    return moved
