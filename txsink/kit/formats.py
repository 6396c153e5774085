"""Parquet, JSON lines and CSV: one writer and one reader for the files and S3 connectors.

A :class:`FormatWriter` encodes Arrow batches into a *binary stream* it is given: the files
connector hands it a staged local file, the S3 connector an in-memory buffer that it cuts
into multipart parts. The writer never closes that stream (its owner fsyncs or uploads it).

What each format cannot hold is refused at the query's start (:func:`check_schema`), before
anything is written: CSV has no nested or binary columns, Parquet no type pyarrow cannot
encode with the chosen codec. JSON lines go through :func:`txsink.kit.jsonrows.json_rows`, which
names the row and column of a value JSON cannot hold (NaN, Infinity).

Rolling: a connector starts a new file/object once the current one holds about
``target_bytes`` (:meth:`FormatWriter.full`, checked after each batch, so a file holds whole
batches). What "holds" counts is fixed per connector and documented there: the Arrow size of
the batches written (files) or the encoded bytes (S3, whose parts and their limits are
encoded bytes).
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Mapping
from typing import Any, Literal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from typing_extensions import override

from txsink.errors import ConfigurationError
from txsink.kit.jsonrows import json_rows
from txsink.rowref import RowNaming

__all__ = [
    "CONTENT_TYPES",
    "FORMATS",
    "PARQUET_CODECS",
    "Format",
    "FormatWriter",
    "Measure",
    "check_options",
    "check_schema",
    "content_type",
    "extension",
    "read_table",
]

Format = Literal["parquet", "jsonl", "csv"]
FORMATS: tuple[Format, ...] = ("parquet", "jsonl", "csv")
PARQUET_CODECS = frozenset({"snappy", "gzip", "brotli", "zstd", "lz4", "none"})
CONTENT_TYPES: Mapping[str, str] = {
    "parquet": "application/vnd.apache.parquet",
    "jsonl": "application/x-ndjson",
    "csv": "text/csv",
}
#: What the rolling rule counts: Arrow bytes of the batches written, or encoded bytes.
Measure = Literal["arrow", "encoded"]


def check_options(sink: str, format: str, compression: str | None) -> str | None:
    """Validate ``format`` and ``compression`` for ``sink`` ("FilesSink", "S3Sink").

    Returns the codec as the writer takes it (lower case, or None for the format's default).

    Raises:
        ValueError: an unknown format, an unknown Parquet codec, or a codec other than
            gzip for JSON lines or CSV (the message names the sink and the choices).
    """
    if format not in FORMATS:
        raise ValueError(f"{sink} format must be one of {sorted(FORMATS)}, got {format!r}")
    if compression is None:
        return None
    if format == "parquet":
        if compression.lower() not in PARQUET_CODECS:
            raise ValueError(
                f"{sink}: parquet compression must be one of {sorted(PARQUET_CODECS)}, "
                f"got {compression!r}"
            )
        return compression.lower()
    if compression != "gzip":
        raise ValueError(f"{sink}: {format} supports compression='gzip' only")
    return compression


def _gzipped(format: str, compression: str | None) -> bool:
    return compression == "gzip" and format != "parquet"


def extension(format: str, compression: str | None) -> str:
    """The file name extension: ``parquet``, ``jsonl``, ``csv``, or ``jsonl.gz`` / ``csv.gz``."""
    return f"{format}.gz" if _gzipped(format, compression) else format


def content_type(format: str, compression: str | None) -> str:
    """The HTTP content type of an object in ``format`` (gzip'd text is application/gzip)."""
    return "application/gzip" if _gzipped(format, compression) else CONTENT_TYPES[format]


def check_schema(
    schema: pa.Schema, format: str, compression: str | None, context: Mapping[str, Any]
) -> None:
    """Refuse, at the start, a column ``format`` cannot hold.

    Raises:
        ConfigurationError: naming the column, its type and the fix; ``context`` (sink uid,
            connector, phase) goes into the error.
    """
    if format == "csv":
        for f in schema:
            if (
                pa.types.is_nested(f.type)
                or pa.types.is_binary(f.type)
                or pa.types.is_large_binary(f.type)
            ):
                raise ConfigurationError(
                    f"column {f.name!r} has type {f.type}, which CSV cannot hold: use "
                    "format='parquet' or 'jsonl', or convert the column (e.g. to_json) "
                    "before the sink",
                    column=f.name,
                    **context,
                )
    if format == "parquet":
        for f in schema:
            try:
                pq.write_table(
                    pa.table({f.name: pa.array([], f.type)}),
                    io.BytesIO(),
                    compression=compression or "snappy",
                )
            except (pa.ArrowException, ValueError) as err:
                raise ConfigurationError(
                    f"column {f.name!r} has type {f.type}, which Parquet cannot hold "
                    f"({err}): convert the column before the sink, or use format='jsonl'",
                    column=f.name,
                    **context,
                ) from err


class _Counting(io.RawIOBase):
    """Forwards writes to the owner's stream and counts the bytes (Parquet asks ``tell``)."""

    def __init__(self, target: Any) -> None:
        super().__init__()
        self.target = target
        self.count = 0

    @override
    def writable(self) -> bool:
        return True

    @override
    def write(self, b: Any) -> int:
        view = memoryview(b)
        self.target.write(view)
        self.count += view.nbytes
        return view.nbytes

    @override
    def tell(self) -> int:
        return self.count


class FormatWriter:
    """Encodes Arrow batches in ``format`` into the binary stream ``target``.

    Args:
        target: anything with ``write(bytes)``: an open file, a buffer. Never closed here.
        format, compression: as :func:`check_options` returned them.
        schema: every batch is cast to it (the file's columns).
        context: error context for rows JSON cannot hold (sink uid, epoch, partition,
            connector).
        target_bytes, measure: the rolling rule (:meth:`full`).
    """

    def __init__(
        self,
        target: Any,
        format: str,
        schema: pa.Schema,
        *,
        compression: str | None = None,
        context: Mapping[str, Any] | None = None,
        target_bytes: int | None = None,
        measure: Measure = "encoded",
    ) -> None:
        self.format = format
        self.schema = schema
        self.context = dict(context or {})
        self.target_bytes = target_bytes
        self.measure: Measure = measure
        self.rows = 0
        self.arrow_bytes = 0
        self._counter = _Counting(target)
        # gzip on top of the counter, so the count is of the compressed bytes. mtime=0: a
        # replay of the same rows writes the same bytes.
        self._gzip = (
            gzip.GzipFile(fileobj=self._counter, mode="wb", mtime=0)
            if _gzipped(format, compression)
            else None
        )
        stream: Any = self._gzip if self._gzip is not None else self._counter
        self._stream = stream
        self._writer: Any = None
        if format == "parquet":
            self._writer = pq.ParquetWriter(
                pa.PythonFile(stream, mode="w"), schema, compression=compression or "snappy"
            )
        elif format == "csv":
            self._writer = pacsv.CSVWriter(pa.PythonFile(stream, mode="w"), schema)

    @property
    def encoded_bytes(self) -> int:
        """Bytes handed to the target so far (gzip holds some back until :meth:`close`)."""
        return self._counter.count

    def write(
        self, batch: pa.RecordBatch, *, first_row: int = 0, naming: RowNaming | None = None
    ) -> None:
        """Encode ``batch``; ``first_row`` is the offset of its first row in errors (JSON
        lines), which name a row as ``naming`` says.

        Raises:
            WriteError: a value JSON cannot hold (the row, at ``first_row`` + its index).
        """
        if batch.schema != self.schema:
            batch = batch.cast(self.schema)
        if self._writer is not None:
            self._writer.write_batch(batch)
        else:
            rows = json_rows(
                batch,
                first_row=first_row,
                alternative=", or use format='parquet'",
                context=self.context,
                naming=naming,
            )
            rows.append("")
            self._stream.write("\n".join(rows).encode())
        self.rows += batch.num_rows
        self.arrow_bytes += batch.nbytes

    def full(self) -> bool:
        """The rolling rule: True once this file/object holds about ``target_bytes``."""
        if self.target_bytes is None:
            return False
        held = self.arrow_bytes if self.measure == "arrow" else self.encoded_bytes
        return held >= self.target_bytes

    def close(self) -> None:
        """Write the footer (Parquet) or the gzip trailer; the target stays open."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._gzip is not None:
            self._gzip.close()  # does not close the counter it was given
            self._gzip = None


def read_table(data: bytes, format: str, compression: str | None = None) -> pa.Table:
    """The rows of one file/object's bytes in ``format``.

    ``compression`` matters for JSON lines and CSV only (``"gzip"``); JSON lines come back
    as JSON types (strings for timestamps, decimals and binary).

    The bytes are in memory already, so Arrow's thread pools are not used: their workers can
    outlive a short process's last read and abort it at exit (apache/arrow#34314, seen as
    ``terminate called without an active exception`` after ``txsink demo`` printed its
    verdict).
    """
    if format == "parquet":
        return pq.read_table(pa.BufferReader(data), use_threads=False, pre_buffer=False)
    if compression == "gzip":
        data = gzip.decompress(data)
    if format == "csv":
        return pacsv.read_csv(
            pa.BufferReader(data), read_options=pacsv.ReadOptions(use_threads=False)
        )
    rows = [json.loads(line) for line in data.decode().splitlines() if line]
    return pa.Table.from_pylist(rows)
