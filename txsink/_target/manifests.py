"""Epoch manifests: the record, written last, that makes an epoch's files visible to readers.

Used by the files and S3 connectors. A manifest is one JSON object per (sink uid, epoch)
under ``_manifests/<uid>-<epoch:020d>.json``, created with an atomic create-if-absent on
a :class:`~txsink.log.LogStore`-like store.
"""

from __future__ import annotations

import json

from txsink.errors import StateError

__all__ = ["check_renamed", "renamed"]


def renamed(raw: bytes, old: str, new: str) -> bytes:
    """A manifest of uid ``old`` rewritten for uid ``new`` (``txsink state rename-uid``)."""
    doc = json.loads(raw)
    doc["uid"] = new
    doc["renamed_from"] = old
    return (json.dumps(doc, indent=1) + "\n").encode()


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
