"""A task's prepared data files, written while its rows arrive.

Rows are gathered to a row group's worth, as the table's properties set it
(``write.parquet.row-group-limit`` rows, 1,048,576 by default, or
``write.parquet.row-group-size-bytes`` of Arrow data, 128 MiB), then conformed to the
table's schema, split by partition value and encoded by pyiceberg's own Parquet writer
(field ids, the table's codec and writer properties) in one background thread per task.
Why: a task larger than a row group goes straight back to reading the next rows from Spark
while pyarrow encodes the last ones (it releases the GIL), and holds at most two row groups
in memory; and the row groups are as large as pyiceberg's own append writes them (smaller
ones encode slower and compress worse: the benchmark's rows in 128k-row groups made files
15% larger, and no faster). One file per partition value the task holds, named after the
transaction (:func:`~txsink.connectors.iceberg.naming.data_file_name`); the statistics are
read back from the footers at commit (:func:`~txsink.connectors.iceberg.files.data_file`).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txsink.connectors.iceberg.checks import conform, target_arrow_schema
from txsink.connectors.iceberg.files import encode_partition
from txsink.connectors.iceberg.handles import IcebergFile
from txsink.connectors.iceberg.naming import data_file_name
from txsink.rowref import RowNaming
from txsink.txid import TxnId

if TYPE_CHECKING:
    from pyiceberg.io.fileformat import FileFormatWriter
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

__all__ = ["FLUSH_BYTES", "FLUSH_ROWS", "PreparedWriter", "rewrite"]

#: The most rows gathered into one row group, whatever the table says.
FLUSH_ROWS = 1_048_576
#: The most bytes of Arrow data gathered into one row group, whatever the table says.
FLUSH_BYTES = 256 << 20


@dataclass
class _File:
    writer: FileFormatWriter
    path: str
    values: tuple[str | None, ...]
    rows: int = 0


@dataclass
class PreparedWriter:
    """The data files of transaction ``txn`` in ``table``: :meth:`add` batches, then
    :meth:`finish` (the files, durable) or :meth:`discard` (nothing left behind)."""

    table: Table
    txn: TxnId
    uid: str
    connector: str
    #: Name a rejected row by its column names and a hash of its values only.
    redact_rows: bool = False
    #: The schema to write (default: the table's current one); an epoch that evolves the
    #: table writes the schema its commit gives it, with its new field ids (:mod:`.evolve`).
    schema: Schema | None = None
    #: The number of this writer's first file (:func:`rewrite` numbers its files apart).
    first_file: int = 0
    _pending: list[pa.RecordBatch] = field(default_factory=list)
    _gathered: int = 0  # rows handed to the encoding thread so far
    _pending_rows: int = 0
    _pending_bytes: int = 0
    _files: dict[str, _File] = field(default_factory=dict)
    _inflight: Future[None] | None = None
    _pool: ThreadPoolExecutor | None = None
    rows: int = 0
    nbytes: int = 0

    def __post_init__(self) -> None:
        from pyiceberg.io.fileformat import FileFormatFactory
        from pyiceberg.manifest import FileFormat
        from pyiceberg.schema import sanitize_column_names
        from pyiceberg.table import TableProperties
        from pyiceberg.table.locations import load_location_provider
        from pyiceberg.utils.properties import property_as_int

        metadata = self.table.metadata
        self._schema = metadata.schema() if self.schema is None else self.schema
        # A rejected row is named by the table's identifier fields (its key), if it has some.
        keys = [self._schema.find_column_name(i) for i in self._schema.identifier_field_ids]
        self._naming = RowNaming(
            tuple(k for k in keys if k), partition=self.txn.partition, redact=self.redact_rows
        )
        self._file_schema = sanitize_column_names(self._schema)
        self._spec = metadata.spec()
        self._arrow = target_arrow_schema(self._schema)
        self._format = FileFormatFactory.get(
            FileFormat(
                metadata.properties.get(
                    TableProperties.WRITE_FILE_FORMAT, TableProperties.WRITE_FILE_FORMAT_DEFAULT
                )
            )
        )
        self._locations = load_location_provider(metadata.location, metadata.properties)
        rows = property_as_int(
            metadata.properties,
            TableProperties.PARQUET_ROW_GROUP_LIMIT,
            TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT,
        )
        size = property_as_int(
            metadata.properties,
            TableProperties.PARQUET_ROW_GROUP_SIZE_BYTES,
            TableProperties.PARQUET_ROW_GROUP_SIZE_BYTES_DEFAULT,
        )
        self._flush_rows = min(FLUSH_ROWS, rows or FLUSH_ROWS)
        self._flush_bytes = min(FLUSH_BYTES, size or FLUSH_BYTES)

    def add(self, batch: pa.RecordBatch) -> None:
        """Gather ``batch``; hand a full row group to the encoding thread."""
        if not batch.num_rows:
            return
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        self._pending_bytes += batch.nbytes
        if self._pending_rows >= self._flush_rows or self._pending_bytes >= self._flush_bytes:
            self._flush()

    def finish(self) -> tuple[IcebergFile, ...]:
        """Encode what is left, close every file; the files as the handle records them."""
        self._flush()
        self._wait()
        if self._pool is not None:
            self._pool.shutdown()
        out = []
        for file in self._files.values():
            file.writer.close()
            out.append((file.path, file.rows, self.table.metadata.default_spec_id, file.values))
        return tuple(out)

    def discard(self) -> None:
        """After a failure: stop, close and delete whatever was written (best effort;
        recovery deletes what a killed task leaves)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        for file in self._files.values():
            with contextlib.suppress(Exception):
                file.writer.close()
            with contextlib.suppress(Exception):
                self.table.io.delete(file.path)

    # -- internals -----------------------------------------------------------------------

    def _flush(self) -> None:
        if not self._pending:
            return
        chunk = pa.Table.from_batches(self._pending)
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        first, self._gathered = self._gathered, self._gathered + chunk.num_rows
        self._wait()  # at most one row group encoding while the next one gathers
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="txsink-iceberg-encode")
        self._inflight = self._pool.submit(self._write, chunk, first)

    def _wait(self) -> None:
        if self._inflight is not None:
            inflight, self._inflight = self._inflight, None
            inflight.result()  # an encoding error surfaces in the task, typed

    def _write(self, chunk: pa.Table, first_row: int) -> None:
        from pyiceberg.io.pyarrow import _determine_partitions

        data = conform(
            chunk,
            self._arrow,
            uid=self.uid,
            connector=self.connector,
            naming=self._naming,
            first_row=first_row,
        )
        self.rows += data.num_rows
        self.nbytes += data.nbytes
        if self._spec.is_unpartitioned():
            self._encode(None, data)
            return
        for part in _determine_partitions(self._spec, self._schema, data):
            self._encode(part.partition_key, part.arrow_table_partition)

    def _encode(self, key: Any, data: pa.Table) -> None:
        from pyiceberg.io.pyarrow import _to_requested_schema
        from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE
        from pyiceberg.utils.config import Config

        if not data.num_rows:
            return
        slot = "" if key is None else key.to_path()
        file = self._files.get(slot)
        if file is None:
            name = data_file_name(self.txn, self.first_file + len(self._files))
            path = self._locations.new_data_location(data_file_name=name, partition_key=key)
            writer = self._format.create_writer(
                self.table.io.new_output(path), self._file_schema, self.table.metadata.properties
            )
            values = (
                () if key is None else encode_partition(self._spec, self._schema, key.partition)
            )
            file = self._files[slot] = _File(writer, path, values)
        downcast = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
        batches = [
            _to_requested_schema(
                requested_schema=self._file_schema,
                file_schema=self._schema,
                batch=batch,
                downcast_ns_timestamp_to_us=downcast,
                include_field_ids=True,
                format_model=self._format,
            )
            for batch in data.to_batches()
        ]
        file.writer.write(pa.Table.from_batches(batches))
        file.rows += data.num_rows


#: Rewritten files are numbered from this many times (the schema id + 1): apart from the
#: task's own (one per partition value) and from another schema's rewrite.
REWRITE_BASE = 1_000_000


def rewrite(
    table: Table, prepared: IcebergFile, txn: TxnId, schema: Schema, position: int, *, uid: str,
    connector: str,
) -> tuple[IcebergFile, ...] | None:  # fmt: skip
    """A decided epoch's data file again, with the field ids ``schema`` gives its columns
    (by name), as new transaction-named files of ``txn``; None when names alone cannot say
    which column is which (a name Parquet needs sanitized).

    Why: another writer changed the table's schema between the epoch's plan and its
    commit, so the ids the task wrote now name other columns, and Iceberg never reuses an
    id. The epoch is decided: its rows must be committed, under the right ids. Read on the
    driver, a file at a time (a rare path). Deterministic names: a commit run again after
    a crash writes the same files."""
    import pyarrow.parquet as pq
    from pyiceberg.schema import sanitize_column_names

    if sanitize_column_names(schema) != schema:
        return None
    path = prepared[0]
    with table.io.new_input(path).open() as stream:
        data = pq.read_table(stream)
    first = REWRITE_BASE * (schema.schema_id + 1) + position
    writer = PreparedWriter(table, txn, uid, connector, schema=schema, first_file=first)
    try:
        for batch in data.to_batches():
            writer.add(batch)
        return writer.finish()
    except BaseException:
        writer.discard()
        raise
