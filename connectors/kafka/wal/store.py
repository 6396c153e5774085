"""Where the Kafka WAL files live: a local (or mounted) folder, or any ``pyarrow.fs``
location (S3, GCS, Azure, HDFS), and how a file gets there whole or not at all.

::

    local folder   <folder>/<txn>/.records.arrow.partial, written and fsynced, renamed to
                   records.arrow, then the folder and its parent fsynced (POSIX calls)
    object store   <bucket>/<prefix>/<txn>/records.arrow through the store's output stream:
    (s3, gcs,      the object appears only when the upload completes (S3: the multipart
     abfs)         upload's completion, or one PutObject); a task killed mid-upload leaves
                   no object, only an incomplete upload for a bucket lifecycle rule
    other pyarrow  written to .records.arrow.partial, then moved to records.arrow
    filesystems

Every file's CRC32 is taken of the bytes as they are written and checked against the
size the location reports once the file is published; the commit checks it again.

:class:`WalStore` is plain data (pickled into tasks with the sink): the location's URL
(no secrets), the options of its ``pyarrow.fs`` filesystem or the filesystem itself.
The options are never logged, put in an error or a ``repr``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from txsink.store import fsync_dir

__all__ = ["OBJECT_STORES", "PublishedFile", "WalStore", "WalWriter", "crc32_of"]

#: ``pyarrow.fs`` filesystems whose output stream publishes the object whole on close.
OBJECT_STORES = frozenset({"s3", "gcs", "abfs"})
#: URL schemes -> the ``pyarrow.fs`` class ``wal_options`` are the keyword arguments of.
_FILESYSTEMS = {"s3": "S3FileSystem", "s3a": "S3FileSystem", "gs": "GcsFileSystem"}
_PARTIAL = ".records.arrow.partial"
_PROBE = ".txsink-check"


@dataclass(frozen=True)
class PublishedFile:
    """A WAL file that is complete at its final name: its size and CRC32."""

    nbytes: int
    crc32: int


@dataclass(eq=False)
class WalStore:
    """The WAL location of one sink: ``url`` (a local path, or ``scheme://...``).

    ``options``: keyword arguments of the URL scheme's ``pyarrow.fs`` filesystem
    (``S3FileSystem(endpoint_override=..., region=..., access_key=..., scheme=...)``);
    ``filesystem``: a ready ``pyarrow.fs.FileSystem`` (``url`` then a path in it, or a URL
    of its scheme). Neither: a local path, or ``FileSystem.from_uri(url)``.
    """

    url: str
    options: Mapping[str, Any] | None = field(default=None, repr=False)
    filesystem: Any = field(default=None, repr=False)
    _fs: Any = field(default=None, init=False, repr=False)
    _root: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        if self.options is not None and self.filesystem is not None:
            raise ValueError("KafkaSink takes wal_options or wal_filesystem, not both")
        scheme = _scheme(self.url)
        if self.options is not None and scheme not in _FILESYSTEMS:
            raise ValueError(
                f"KafkaSink wal_options are for a wal= URL of {sorted(_FILESYSTEMS)}; for "
                f"{self.url!r} pass wal_filesystem=<a pyarrow.fs.FileSystem> instead"
            )
        if scheme == "file":
            self.url = self.url.partition("://")[2]
        if self.is_local:
            self.url = os.path.abspath(self.url)

    def __getstate__(self) -> dict[str, Any]:
        # The filesystem is rebuilt in each process from its options (pyarrow's own pickle
        # of a filesystem given whole).
        return {**self.__dict__, "_fs": None, "_root": ""}

    @property
    def is_local(self) -> bool:
        """A local (or mounted) folder: POSIX calls, fsync, rename."""
        if self.filesystem is not None:
            return bool(self.filesystem.type_name == "local") and not _scheme(self.url)
        return not _scheme(self.url)

    @property
    def kind(self) -> str:
        """``"local"``, or the ``pyarrow.fs`` type (``"s3"``, ``"gcs"``, ``"hdfs"``...)."""
        return "local" if self.is_local else str(self._filesystem()[0].type_name)

    def path(self, rel: str) -> str:
        """The full path of ``rel`` (``<txn>/records.arrow``) in the location."""
        if self.is_local:
            return os.path.join(self.url, rel) if rel else self.url
        root = self._filesystem()[1]
        return f"{root}/{rel}" if rel else root

    # -- writing ----------------------------------------------------------------------

    def writer(self, rel: str) -> WalWriter:
        """A new file at ``rel`` (replacing a retried attempt's), published by
        :meth:`WalWriter.publish` only."""
        if self.is_local:
            local = Path(self.url, os.path.dirname(rel))
            shutil.rmtree(local, ignore_errors=True)
            local.mkdir(parents=True)
            partial = str(local / _PARTIAL)
            return WalWriter(self, rel, partial, open(partial, "wb"))
        fs, _ = self._filesystem()
        final = self.path(rel)
        if fs.type_name in OBJECT_STORES:  # the upload replaces a retried attempt's object
            return WalWriter(self, rel, final, fs.open_output_stream(final))
        folder = os.path.dirname(final)
        with contextlib.suppress(FileNotFoundError):
            fs.delete_dir(folder)
        fs.create_dir(folder)
        temp = f"{folder}/{_PARTIAL}"
        return WalWriter(self, rel, temp, fs.open_output_stream(temp))

    def check_writable(self) -> None:
        """Create the location and write, read back and delete a small probe file (OSError
        if any step fails)."""
        if self.is_local:
            os.makedirs(self.url, exist_ok=True)
        probe = self.writer(f"{_PROBE}/probe")
        probe.write(b"txsink")
        published = probe.publish()
        if crc32_of(self.read(f"{_PROBE}/probe")) != published.crc32:
            raise OSError(f"the probe file written to {self.url} reads back different")
        self.delete_dir(_PROBE)

    # -- reading ----------------------------------------------------------------------

    def exists(self, rel: str) -> bool:
        if self.is_local:
            return os.path.exists(self.path(rel))
        from pyarrow.fs import FileType

        fs, _ = self._filesystem()
        return bool(fs.get_file_info(self.path(rel)).type == FileType.File)

    def read(self, rel: str) -> pa.Buffer:
        """The whole file (a memory map for a local one, else one download)."""
        if self.is_local:
            with pa.memory_map(self.path(rel)) as source:
                return source.read_buffer()
        fs, _ = self._filesystem()
        with fs.open_input_stream(self.path(rel)) as source:
            return source.read_buffer()

    def list_dirs(self) -> list[str]:
        """The names of the folders (prefixes) directly in the location, sorted."""
        if self.is_local:
            try:
                return sorted(os.listdir(self.url))
            except FileNotFoundError:
                return []
        from pyarrow.fs import FileSelector, FileType

        fs, root = self._filesystem()
        found = fs.get_file_info(FileSelector(root, allow_not_found=True))
        return sorted(i.base_name for i in found if i.type == FileType.Directory)

    def list_files(self) -> list[str]:
        """Every file under the location (tests count what is left)."""
        if self.is_local:
            return [os.path.join(d, f) for d, _, files in os.walk(self.url) for f in files]
        from pyarrow.fs import FileSelector, FileType

        fs, root = self._filesystem()
        found = fs.get_file_info(FileSelector(root, allow_not_found=True, recursive=True))
        return [i.path for i in found if i.type == FileType.File]

    def delete_dir(self, rel: str) -> None:
        """Delete the folder ``rel`` and what is in it; nothing there is fine."""
        if self.is_local:
            shutil.rmtree(self.path(rel), ignore_errors=True)
            return
        fs, _ = self._filesystem()
        with contextlib.suppress(FileNotFoundError):
            fs.delete_dir(self.path(rel))

    # -- the filesystem ---------------------------------------------------------------

    def _filesystem(self) -> tuple[Any, str]:
        """This process's ``pyarrow.fs`` filesystem and the location's root path in it."""
        if self._fs is None:
            self._fs, self._root = _open_filesystem(self.url, self.options, self.filesystem)
        return self._fs, self._root


@dataclass(eq=False)
class WalWriter:
    """A WAL file being written: a file-like sink for ``pa.ipc.new_file`` that keeps the
    CRC32 and size of what passed, published whole by :meth:`publish`."""

    store: WalStore
    rel: str
    temp: str
    out: Any
    crc32: int = 0
    nbytes: int = 0
    closed: bool = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.crc32 = zlib.crc32(view, self.crc32)
        self.nbytes += view.nbytes
        self.out.write(view)
        return view.nbytes

    def flush(self) -> None:
        """Nothing: the IPC writer flushes per batch, the bytes go out at :meth:`publish`."""

    def close(self) -> None:
        """Called by ``pa.ipc`` writers when done: the file is closed by :meth:`publish`."""

    def publish(self) -> PublishedFile:
        """Make the file complete at its final name, durably; its size and CRC32."""
        store, final = self.store, self.store.path(self.rel)
        if store.is_local:
            self.out.flush()
            os.fsync(self.out.fileno())
            self.out.close()
            os.replace(self.temp, final)
            fsync_dir(os.path.dirname(final))
            fsync_dir(os.path.dirname(os.path.dirname(final)))
        else:
            self.out.close()  # an object store publishes the object here, whole
            fs, _ = store._filesystem()
            if self.temp != final:
                fs.move(self.temp, final)
            size = fs.get_file_info(final).size
            if size != self.nbytes:
                raise OSError(
                    f"WAL file {final}: {size} bytes stored, {self.nbytes} written; the "
                    "filesystem did not store the file whole"
                )
        self.closed = True
        return PublishedFile(self.nbytes, self.crc32)

    def discard(self) -> None:
        """Give the file up: closed, and its folder deleted (a torn file never stays)."""
        with contextlib.suppress(Exception):
            self.out.close()
        self.closed = True
        with contextlib.suppress(Exception):
            self.store.delete_dir(os.path.dirname(self.rel))


def crc32_of(data: pa.Buffer | bytes) -> int:
    """The CRC32 of a whole file's bytes."""
    return zlib.crc32(memoryview(data))


def _scheme(url: str) -> str:
    head, sep, _ = url.partition("://")
    return head.lower() if sep and head.isalnum() else ""


def _open_filesystem(url: str, options: Mapping[str, Any] | None, given: Any) -> tuple[Any, str]:
    from pyarrow import fs

    scheme = _scheme(url)
    if given is not None:
        path = url.partition("://")[2] if scheme else url
        return given, path.rstrip("/")
    if options is not None:
        cls = getattr(fs, _FILESYSTEMS[scheme])
        opts = dict(options)
        if cls is fs.S3FileSystem:
            # Small files in one PutObject on close: no multipart upload to leave behind.
            opts.setdefault("allow_delayed_open", True)
        return cls(**opts), url.partition("://")[2].rstrip("/")
    found, path = fs.FileSystem.from_uri(url)
    return found, str(path).rstrip("/")
