"""Prepared data files: written by a task with pyiceberg's own Parquet writer, under
transaction-named paths; turned back into ``DataFile`` entries at commit from the footer.

Partitioned tables are split by partition value in Arrow with pyiceberg's own code (any
transform pyiceberg writes: identity, bucket, day, ...), one file per value.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from typing_extensions import override

from txsink.connectors.iceberg.handles import IcebergFile
from txsink.connectors.iceberg.naming import data_file_name
from txsink.txid import TxnId

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.typedef import Record

__all__ = ["data_file", "write_prepared"]

_NAMESPACE = uuid.UUID("6f1c3f0e-6a0b-4b7e-9d51-2f9c1b7d8e01")


def _named_task_type() -> type[Any]:
    from pyiceberg.table import WriteTask

    @dataclass(frozen=True)
    class NamedWriteTask(WriteTask):
        """pyiceberg's write task with txsink's deterministic file name."""

        file_name: str = ""

        @override
        def generate_data_file_filename(self, extension: str) -> str:
            return self.file_name

    return NamedWriteTask


def _encode(spec: PartitionSpec, schema: Schema, record: Record) -> tuple[str | None, ...]:
    from pyiceberg.conversions import to_bytes

    fields = spec.partition_type(schema).fields
    return tuple(
        None if record[i] is None else to_bytes(f.field_type, record[i]).hex()  # type: ignore[arg-type]
        for i, f in enumerate(fields)
    )


def _decode(spec: PartitionSpec, schema: Schema, values: Sequence[str | None]) -> Record:
    from pyiceberg.conversions import from_bytes
    from pyiceberg.typedef import Record

    fields = spec.partition_type(schema).fields
    return Record(
        *(
            None if v is None else from_bytes(f.field_type, bytes.fromhex(v))  # type: ignore[arg-type]
            for f, v in zip(fields, values, strict=True)
        )
    )


def write_prepared(table: Table, txn: TxnId, data: pa.Table) -> tuple[IcebergFile, ...]:
    """Write ``data`` (already in the table's schema) as the files of ``txn``."""
    from pyiceberg.io.pyarrow import _determine_partitions, write_file

    metadata = table.metadata
    schema, spec = metadata.schema(), metadata.spec()
    task_type = _named_task_type()
    write_uuid = uuid.uuid5(_NAMESPACE, str(txn))
    if spec.is_unpartitioned():
        parts: list[tuple[Any, pa.Table]] = [(None, data)]
    else:
        parts = [
            (p.partition_key, p.arrow_table_partition)
            for p in _determine_partitions(spec=spec, schema=schema, arrow_table=data)
        ]
    tasks = [
        task_type(
            write_uuid=write_uuid,
            task_id=n,
            schema=schema,
            record_batches=part.to_batches(),
            partition_key=key,
            file_name=data_file_name(txn, n),
        )
        for n, (key, part) in enumerate(parts)
        if part.num_rows
    ]
    written = list(write_file(table.io, metadata, iter(tasks)))
    return tuple(
        (
            f.file_path,
            f.record_count,
            metadata.default_spec_id,
            _encode(spec, schema, f.partition) if not spec.is_unpartitioned() else (),
        )
        for f in written
    )


def data_file(table: Table, prepared: IcebergFile) -> DataFile | None:
    """The ``DataFile`` entry of a prepared file, from its footer; None if it is gone."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    path, _rows, spec_id, values = prepared
    metadata = table.metadata
    schema = metadata.schema()
    spec = metadata.specs()[spec_id]
    source = table.io.new_input(path)
    if not source.exists():
        return None
    with source.open() as stream:
        footer = pq.read_metadata(stream)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    partition = (
        _decode(spec, schema, values) if values is not None else statistics.partition(spec, schema)
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        file_size_in_bytes=len(source),
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
