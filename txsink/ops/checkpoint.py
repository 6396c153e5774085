"""Spark's checkpoint directory, the other half of a pipeline's state: what it says, whether
it matches a txsink log, and its copy in and out of a savepoint.

What txsink reads of it (Spark's layout): ``metadata`` (its first line is JSON with the
query ``id``, which is the txsink app id), ``offsets/<batch>`` (batches Spark planned)
and ``commits/<batch>`` (batches Spark finished). Only a local or mounted directory is
read or written here; a checkpoint on HDFS or an object store is copied with that
system's own tools.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txsink.errors import SavepointError
from txsink.ops.savepoint_manifest import CHECKPOINT_PREFIX, entry, sha
from txsink.protocol.log import TxLog
from txsink.store import LogStore

__all__ = [
    "CheckpointInfo",
    "check_checkpoint_matches",
    "checkpoint_records",
    "inspect_checkpoint",
    "restore_checkpoint",
]


@dataclass(frozen=True)
class CheckpointInfo:
    """What a Spark checkpoint directory says about the query (see :func:`inspect_checkpoint`).

    ``next_batch`` is the batch Spark runs first when the query starts from it: the last
    planned batch again if Spark did not finish it (``commits/`` one behind ``offsets/``),
    else the one after.
    """

    path: str
    query_id: str | None
    last_offsets: int | None
    last_commit: int | None

    @property
    def next_batch(self) -> int:
        if self.last_offsets is None:
            return 0
        if self.last_commit is None or self.last_commit < self.last_offsets:
            return self.last_offsets
        return self.last_offsets + 1


def inspect_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Read the query id and the last planned and finished batch of a Spark checkpoint."""
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "://" in text:
        raise SavepointError(
            f"Spark checkpoint {text!r}: only a local or mounted path can be copied here. "
            "Copy a checkpoint on HDFS or an object store yourself while the query is "
            "stopped (hadoop distcp, or your object store's own copy tool), and take the "
            "savepoint without --checkpoint"
        )
    root = Path(text).absolute()
    if not (root / "metadata").is_file():
        raise SavepointError(
            f"{root} is not a Spark checkpoint directory (no 'metadata' file): give the "
            "query's checkpointLocation"
        )
    query_id: str | None = None
    try:
        first = (root / "metadata").read_text().splitlines()[0]
        query_id = str(json.loads(first)["id"])
    except (IndexError, KeyError, ValueError) as err:
        raise SavepointError(f"cannot read the query id from {root / 'metadata'}: {err}") from err
    return CheckpointInfo(
        str(root), query_id, _last_batch(root / "offsets"), _last_batch(root / "commits")
    )


def _last_batch(folder: Path) -> int | None:
    if not folder.is_dir():
        return None
    batches = [int(name) for name in os.listdir(folder) if name.isdigit()]
    return max(batches) if batches else None


def check_checkpoint_matches(
    info: CheckpointInfo, log: TxLog, app_id: str, last: int | None
) -> None:
    """Refuse a checkpoint that would not continue this log exactly once.

    It must be the same query (its id is the log's ``app_id``) and restart at the log's
    last committed epoch ``last`` (a replay, skipped) or the one after.
    """
    if info.query_id != app_id:
        raise SavepointError(
            f"the Spark checkpoint {info.path} belongs to query {info.query_id!r}, but the "
            f"txsink log at {log.location} to app {app_id!r}: they are not the same pipeline's "
            "state. Give the checkpointLocation of the query that writes this log (if your "
            "pipeline passes app_id= explicitly, copy its checkpoint yourself and take the "
            "savepoint without --checkpoint)"
        )
    nxt = info.next_batch
    if last is None:
        if nxt > 0:
            raise SavepointError(
                f"Spark finished batches up to {info.last_commit} in {info.path}, but the "
                f"txsink log at {log.location} has no committed epoch: those batches were not "
                "written through this log. Give the log the query writes with"
            )
        return
    if nxt < last:
        raise SavepointError(
            f"the Spark checkpoint {info.path} would restart at batch {nxt} (offsets up to "
            f"{info.last_offsets}, commits up to {info.last_commit}), but the txsink log at "
            f"{log.location} already committed epoch {last}: the checkpoint is older than the "
            "log and cannot replay that far (a restart would fail with "
            "CheckpointMismatchError). Use the checkpoint directory the query last ran with, "
            "copied after the query stopped"
        )
    if nxt > last + 1:
        raise SavepointError(
            f"the Spark checkpoint {info.path} has finished batches up to {info.last_commit}, "
            f"but the txsink log at {log.location} committed only up to epoch {last}: batches "
            f"{last + 1}..{nxt - 1} were not written through this log (another log, or a "
            "checkpoint of another run). Give the matching log and checkpoint"
        )


def checkpoint_records(info: CheckpointInfo) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
    """The checkpoint's files as savepoint records (keys under ``spark-checkpoint/``) and
    the manifest's ``checkpoint`` section, which lists them."""
    records = [(CHECKPOINT_PREFIX + rel, data) for rel, data in _read_tree(Path(info.path))]
    doc = {
        "source": info.path,
        "query_id": info.query_id,
        "last_offsets": info.last_offsets,
        "last_commit": info.last_commit,
        "next_batch": info.next_batch,
        "files": [entry(key, data) for key, data in records],
    }
    return records, doc


def restore_checkpoint(
    entries: Sequence[dict[str, Any]], store: LogStore, dest: Path, savepoint: str
) -> int:
    """Write the checkpoint copy listed by the manifest ``entries`` into ``dest``.

    ``dest`` must be missing or empty, or already hold exactly these files (a restore
    done before: 0 files written). The copy appears whole: written aside, then renamed
    into place, so a restore cut short never leaves a partial checkpoint that Spark
    would start from. Returns the number of files written.
    """
    files = {str(e["key"])[len(CHECKPOINT_PREFIX) :]: e for e in entries}
    if dest.exists() and any(dest.iterdir()):
        have = {rel: data for rel, data in _read_tree(dest)}
        same = set(have) == set(files) and all(
            sha(have[rel]) == files[rel]["sha256"] for rel in files
        )
        if same:
            return 0
        raise SavepointError(
            f"the checkpoint directory {dest} is not empty: restore the Spark checkpoint into "
            "a new, empty directory (and point the query's checkpointLocation at it)"
        )
    tmp = dest.parent / f".{dest.name}.restoring-{uuid.uuid4().hex[:8]}"
    try:
        for rel, record in files.items():
            data = store.read(str(record["key"]))
            if data is None or sha(data) != record["sha256"]:
                raise SavepointError(
                    f"savepoint record {record['key']} at {savepoint} is missing or changed"
                )
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        tmp.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.rmdir()  # empty (checked above); rename needs the name free
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(files)


def _read_tree(root: Path) -> Iterator[tuple[str, bytes]]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath, name)
            yield full.relative_to(root).as_posix(), full.read_bytes()
