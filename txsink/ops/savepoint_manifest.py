"""The manifest of a savepoint (``savepoint.json``): its format, its entries, its check.

The manifest is written last and lists every record of the savepoint with its size and
sha256, so a copy cut short (no manifest) or damaged (a record missing or different) is
refused before anything is restored from it. The layout it describes is in
:mod:`txsink.ops.savepoint`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from txsink.errors import SavepointError
from txsink.protocol.log import LOG_FORMAT_VERSION
from txsink.store import LogStore

__all__ = [
    "CHECKPOINT_PREFIX",
    "MANIFEST",
    "RESTORED_MARKER",
    "SAVEPOINT_FORMAT",
    "SAVEPOINT_VERSION",
    "checkpoint_entries",
    "entry",
    "sha",
    "verify_manifest",
]

SAVEPOINT_FORMAT = "txsink-savepoint"
SAVEPOINT_VERSION = 1
MANIFEST = "savepoint.json"
CHECKPOINT_PREFIX = "spark-checkpoint/"
#: Written into a restored log last: the restore is complete.
RESTORED_MARKER = "restored-from-savepoint.json"


def verify_manifest(store: LogStore, location: str) -> dict[str, Any]:
    """The manifest of the savepoint in ``store``, once every record it lists checks out.

    Raises:
        SavepointError: no manifest (incomplete copy, or not a savepoint), a format version
            this txsink cannot read, a record missing or different from the manifest.
    """
    raw = store.read(MANIFEST)
    if raw is None:
        hint = (
            " (it holds log records: an incomplete savepoint, cut short before its manifest "
            "was written; take it again)"
            if store.read("meta.json") is not None
            else ""
        )
        raise SavepointError(f"no savepoint at {location}: no {MANIFEST}{hint}")
    try:
        manifest = json.loads(raw)
    except ValueError as err:
        raise SavepointError(
            f"the savepoint manifest {MANIFEST} at {location} is not JSON ({err}): the "
            "savepoint is incomplete or damaged; take it again"
        ) from err
    if not isinstance(manifest, dict) or manifest.get("format") != SAVEPOINT_FORMAT:
        raise SavepointError(
            f"{location}/{MANIFEST} is not a txsink savepoint manifest (format "
            f"{manifest.get('format') if isinstance(manifest, dict) else None!r})"
        )
    version = manifest.get("version")
    if version != SAVEPOINT_VERSION:
        raise SavepointError(
            f"the savepoint at {location} has format version {version!r}, written by txsink "
            f"{manifest.get('txsink_version')!r}; this txsink reads savepoint version "
            f"{SAVEPOINT_VERSION} only: restore it with that txsink version (or newer)"
        )
    log_version = manifest.get("log_format_version")
    if type(log_version) is not int or not 1 <= log_version <= LOG_FORMAT_VERSION:
        raise SavepointError(
            f"the savepoint at {location} holds a txsink log of format version "
            f"{log_version!r} (written by txsink {manifest.get('txsink_version')!r}); this "
            f"txsink reads log format versions 1 to {LOG_FORMAT_VERSION}: restore it with "
            "that txsink release (or newer)"
        )
    entries = (*manifest["records"], *checkpoint_entries(manifest))
    problems = [p for e in entries if (p := _check_entry(store, e))]
    if problems:
        raise SavepointError(
            f"the savepoint at {location} is incomplete or damaged: {len(problems)} of its "
            f"records fail the manifest's check ({'; '.join(problems[:3])}). Take the "
            "savepoint again from the log (or use another copy of it)"
        )
    return manifest


def checkpoint_entries(manifest: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The entries of the Spark checkpoint copy; none if it was taken without one."""
    ckpt = manifest.get("checkpoint") or {}
    return tuple(ckpt.get("files", ()))


def _check_entry(store: LogStore, entry: dict[str, Any]) -> str | None:
    data = store.read(entry["key"])
    if data is None:
        return f"{entry['key']} is missing"
    if len(data) != entry["bytes"] or sha(data) != entry["sha256"]:
        return f"{entry['key']} differs ({len(data)} bytes, expected {entry['bytes']})"
    return None


def entry(key: str, data: bytes) -> dict[str, Any]:
    """The manifest's entry for the record ``key`` holding ``data``."""
    return {"key": key, "bytes": len(data), "sha256": sha(data)}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
