"""Where the txsink log lives: a key-value store with an atomic create-if-absent.

:class:`FileStore` (a local or mounted POSIX filesystem) is built in; other stores are
registered by connectors under a URL scheme (:mod:`txsink.registry`): the S3
connector's ``s3://``, say. The files connector's epoch manifests use
:meth:`FileStore.create` too, so there is one create-if-absent on files.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any, Protocol

from txsink import registry
from txsink.errors import LogError

__all__ = ["FileStore", "LogStore", "fsync_dir", "open_store"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries durable (a new, renamed or linked name in it): the file
    store's, and the file-backed connectors' (staged files, WAL files, Delta files).

    fsyncing a file makes its bytes durable, not its name: after a crash the
    name can be gone unless the directory itself is fsynced too.
    """
    fd = os.open(Path(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LogStore(Protocol):
    """Key-value storage for the log. ``create`` must be atomic create-if-absent."""

    location: str

    def create(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` unless the key exists; True if this call created it."""
        ...

    def read(self, key: str) -> bytes | None: ...

    def list(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``, sorted."""
        ...

    def delete(self, key: str) -> None: ...


class FileStore:
    """A :class:`LogStore` on a local or mounted POSIX filesystem.

    ``create`` writes a temporary file, fsyncs it and hard-links it into place:
    ``link`` fails if the name exists, so creation is atomic and a reader never
    sees a half-written record. The directory is fsynced after each change.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.location = str(self.root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad log key {key!r}")
        return self.root / key

    def create(self, key: str, data: bytes) -> bool:
        try:
            return self._create(key, data)
        except OSError as err:
            raise LogError(
                f"cannot write txsink log record {key} under {self.root}: {err.strerror or err}; "
                "check that the folder exists, is writable and has free space",
            ) from err

    def _create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{path.name}-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(path.parent)
        return True

    def read(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:  # a file where a folder should be, no permission
            raise LogError(
                f"cannot read {key} under {self.root}: {err.strerror or err}; check that "
                f"{self.root} is a folder this process can read",
            ) from err

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.endswith("/") else self._path(prefix).parent
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(".tmp-"):
                    continue
                key = os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/")
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Remove emptied epoch folders so listings stay short.
        with contextlib.suppress(OSError):
            path.parent.rmdir()


def open_store(location: str | os.PathLike[str] | LogStore, **options: Any) -> LogStore:
    """The store at a filesystem path, a ``file://`` URL, or a URL of a registered scheme.

    ``options`` go to a registered store's factory; a store object is returned as it is.
    """
    if not isinstance(location, (str, os.PathLike)):
        if options:
            raise ValueError("open_log: store options apply to a location, not a store")
        return location
    loc = os.fspath(location)
    if loc.startswith("file://"):
        loc = loc[len("file://") :]
    if "://" not in loc:
        if options:
            raise ValueError(
                f"open_log: options {sorted(options)} apply to a store URL, not to the "
                f"local path {loc!r}"
            )
        return FileStore(loc)
    scheme = loc.split("://", 1)[0]
    schemes = registry.log_store_schemes()
    if scheme not in schemes:
        known = ", ".join(f"{s}:// ({c.name})" for s, (c, _) in sorted(schemes.items()))
        # A connector that failed to load may be the one that registers this scheme.
        broken = "".join(f"; {u.error()}" for u in registry.unloadable().values())
        raise LogError(
            f"txsink log location {loc!r}: no store is registered for scheme {scheme!r}; "
            f"use a local or mounted filesystem path or a registered scheme "
            f"({known or 'none installed'}){broken}"
        )
    record, ref = schemes[scheme]
    store: LogStore = registry.load(ref, record)(loc, **options)
    return store
