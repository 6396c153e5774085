"""Prepared data files as the handle records them, turned back into ``DataFile`` entries at
commit from their footers (the task that wrote them: :mod:`.writer`).

A partition tuple travels as Iceberg's single-value bytes in hex (any transform pyiceberg
writes: identity, bucket, day, ...), so the handle stays JSON and exact.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from txsink.connectors.iceberg.handles import IcebergFile

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.typedef import Record

__all__ = ["FileIdsDiffer", "data_file", "encode_partition"]

_NAMESPACE = uuid.UUID("6f1c3f0e-6a0b-4b7e-9d51-2f9c1b7d8e01")


def encode_partition(spec: PartitionSpec, schema: Schema, record: Record) -> tuple[str | None, ...]:
    """A partition tuple as the handle records it: Iceberg single-value bytes, in hex."""
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


class FileIdsDiffer(Exception):
    """A data file's field ids are not the schema's (:func:`data_file` with ``ids``)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path, self.detail = path, detail


def data_file(
    table: Table, prepared: IcebergFile, schema: Schema | None = None, *, ids: bool = False
) -> DataFile | None:
    """The ``DataFile`` entry of a prepared file, from its footer; None if it is gone.

    ``schema``: the schema the commit gives the table (default: its current one), for the
    column statistics and the partition tuple. ``ids``: also verify that the file's field
    ids are that schema's (a commit that evolves the schema: :mod:`.evolve`), else raise
    :class:`FileIdsDiffer`."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    path, _rows, spec_id, values = prepared
    metadata = table.metadata
    schema = metadata.schema() if schema is None else schema
    spec = metadata.specs()[spec_id]
    source = table.io.new_input(path)
    if not source.exists():
        return None
    with source.open() as stream:
        footer = pq.read_metadata(stream)
    if ids:
        from txsink.connectors.iceberg.evolve import check_file_ids

        differs = check_file_ids(schema, footer)
        if differs is not None:
            raise FileIdsDiffer(path, differs)
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
