"""The catalog, the table and its storage, as the sink reaches them (driver and executors).

Catalog properties are pyiceberg's own (``type``, ``uri``, ``warehouse``, ``s3.endpoint``,
``s3.access-key-id``...): they can hold secrets, so nothing here logs or formats them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigurationError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.table import Table

__all__ = [
    "added_in_epochs",
    "data_location",
    "list_files",
    "load_catalog",
    "load_table",
    "path_key",
    "referenced",
]

_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"


def load_catalog(name: str, properties: Mapping[str, str]) -> Catalog:
    """The catalog, with pyarrow's FileIO (it lists the data location for recovery)."""
    from pyiceberg.catalog import load_catalog as _load

    return _load(name, **{"py-io-impl": _IO, **properties})


def load_table(catalog: Catalog, identifier: str, *, uid: str, connector: str) -> Table:
    """``identifier`` from ``catalog``; a missing one is a :class:`ConfigurationError`."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        raise ConfigurationError(
            f"Iceberg table {identifier!r} does not exist in catalog {catalog.name!r}: create "
            "it first, or set create=True to let the sink create it from the stream's schema",
            sink_uid=uid,
            connector=connector,
        ) from None


def file_io(table: Table) -> PyArrowFileIO:
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = table.io
    if not isinstance(io, PyArrowFileIO):  # pragma: no cover - load_catalog sets it
        raise TypeError(f"the Iceberg sink needs {_IO}, got {type(io).__name__}")
    return io


def data_location(table: Table) -> str:
    """Where the table's data files go (``<location>/data`` or ``write.data.path``)."""
    from pyiceberg.table.locations import load_location_provider

    return load_location_provider(table.location(), table.properties).data_path


def path_key(table: Table, location: str) -> str:
    """A location without its scheme (``s3a://b/k`` and ``s3://b/k`` are one file)."""
    return file_io(table).parse_location(location, table.io.properties)[2]


def list_files(table: Table) -> Iterator[str]:
    """Every file under the table's data location, as scheme-less keys (:func:`path_key`)."""
    from pyarrow.fs import FileSelector, FileType

    io = file_io(table)
    scheme, netloc, path = io.parse_location(data_location(table), io.properties)
    fs = io.fs_by_scheme(scheme, netloc)
    for info in fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True)):
        if info.type == FileType.File:
            yield info.path


def referenced(table: Table) -> set[str]:
    """The data files any snapshot of the table references (scheme-less keys)."""
    io = table.io
    found: set[str] = set()
    seen_manifests: set[str] = set()
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                found.add(path_key(table, entry.data_file.file_path))
    return found


def added_in_epochs(table: Table, app: str, uid: str, epochs: Iterable[int]) -> set[str] | None:
    """The data files the commits of ``epochs`` by ``app``'s sink ``uid`` added (scheme-less
    keys), read from those snapshots' own manifests only; None when one of those snapshots
    is gone (expired): then only :func:`referenced`, the whole history, can tell.

    Why: recovery and abort ask "is this prepared file in the table?" for files of a few
    epochs; reading every manifest of every snapshot for that grows with the table's
    history, this with the epochs asked about.
    """
    from txsink.connectors.iceberg.naming import SUMMARY_APP, SUMMARY_EPOCH, SUMMARY_UID

    wanted = {str(e) for e in epochs}
    ours = {}
    for snapshot in table.snapshots():
        summary = snapshot.summary
        if (
            summary is not None
            and summary.get(SUMMARY_APP) == app
            and summary.get(SUMMARY_UID) == uid
            and summary.get(SUMMARY_EPOCH) in wanted
        ):
            ours[snapshot.snapshot_id] = snapshot
    if {str(s.summary[SUMMARY_EPOCH]) for s in ours.values() if s.summary} != wanted:
        return None
    io = table.io
    found: set[str] = set()
    for sid, snapshot in ours.items():
        for manifest in snapshot.manifests(io):
            if manifest.added_snapshot_id != sid:
                continue
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                found.add(path_key(table, entry.data_file.file_path))
    return found


def describe(exc: BaseException) -> str:
    """An exception's type only: library messages can carry a catalog URI with a password."""
    kind: Any = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"
