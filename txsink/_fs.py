"""Filesystem durability helpers shared by the log and the file-backed connectors."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries durable (a new, renamed or linked name in it).

    fsyncing a file makes its bytes durable, not its name: after a crash the
    name can be gone unless the directory itself is fsynced too.
    """
    fd = os.open(Path(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
