"""Arrow rows to Kafka records: topic, partition, key, value and headers per row.

Runs in the pre-commit tasks (and in replay mode again in the commit tasks), so every
record the broker would refuse after the decision — too large for its topic as the broker
counts it, a null or missing topic, a partition the topic does not have, a value JSON or
Avro cannot hold — is refused here, naming the row and column (the topic checks:
:mod:`~txsink.connectors.kafka.records.topics`).

Conversions (``"auto"`` format): binary as is, strings UTF-8, numbers as their decimal
text, anything else as JSON; without ``value`` the value is a JSON object of every
payload column (not key, headers, topic or partition). ``"avro"``: Confluent Avro
through :class:`~txsink.connectors.kafka.records.avro.AvroEncoder`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txsink.connectors.kafka.records.avro import AvroEncoder
from txsink.connectors.kafka.records.limits import batch_sizes, largest_batch_size
from txsink.connectors.kafka.records.topics import TopicLookup, check_records
from txsink.errors import TxsinkError, WriteError
from txsink.kit.jsonrows import json_rows
from txsink.rowref import RowNaming

__all__ = ["EPOCH_HEADER", "RECORD_SCHEMA", "RecordFormat", "avro_encoders", "epoch_tag"]

#: The records of one Kafka commit, as the WAL stores them and the producers take them.
RECORD_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
_HEADERS = RECORD_SCHEMA.field("headers").type

#: The header ``KafkaSink(epoch_header=True)`` adds to every record: ``<app>/<uid>/<epoch>``,
#: by which an audit finds the epoch's records (:mod:`~txsink.connectors.kafka.audit`).
EPOCH_HEADER = "txsink.epoch"


def epoch_tag(app: str, uid: str, epoch: int) -> bytes:
    """The :data:`EPOCH_HEADER` value of ``epoch``'s records of sink ``uid`` of ``app``."""
    return f"{app}/{uid}/{epoch}".encode()


def avro_encoders(
    *,
    topic: str | None = None,
    key: str | None,
    key_format: str,
    value_format: str,
    key_schema: str | None,
    value_schema: str | None,
    schema_registry: Mapping[str, Any] | None,
    avro_config: Mapping[str, Any] | None,
) -> dict[str, AvroEncoder]:
    """The Avro encoders of the key and value that are ``"avro"``; ``ValueError`` for a
    format that is not ``"auto"`` or ``"avro"``, or Avro without a registry or a key column."""
    encoders: dict[str, AvroEncoder] = {}
    for field_, fmt, schema_, column in (
        ("key", key_format, key_schema, key),
        ("value", value_format, value_schema, "value"),
    ):
        if fmt not in ("auto", "avro"):
            raise ValueError(f"KafkaSink {field_}_format must be 'auto' or 'avro', not {fmt!r}")
        if fmt == "avro":
            if schema_registry is None:
                raise ValueError(
                    f"KafkaSink({field_}_format='avro') needs schema_registry={{'url': ...}}"
                )
            if column is None:
                raise ValueError("KafkaSink(key_format='avro') needs key=<column>")
            encoders[field_] = AvroEncoder(
                field_, schema_registry, schema_, avro_config, topic=topic
            )
    return encoders


@dataclass(frozen=True)
class RecordFormat:
    """Which columns make a record and how they are encoded (the sink's record options)."""

    uid: str
    topic: str | None
    key: str | None = None
    value: str | None = None
    headers: str | None = None
    topic_column: str | None = None
    partition_column: str | None = None
    #: The cap when the topic was not described (the sink's check did not run): the
    #: explicit ``max_record_bytes``, else the producer's ``message.max.bytes``.
    max_record_bytes: int = 1_000_000
    #: Errors name a row by its column names and a hash of its values only.
    redact_rows: bool = False
    #: ``"key"`` / ``"value"`` -> its Avro encoder; its schema is fixed at start.
    avro: dict[str, AvroEncoder] = field(default_factory=dict)
    #: The topics as the brokers describe them (the check seeds ``topic``'s; a
    #: ``topic_column``'s are asked for in the tasks, once per topic).
    topics: TopicLookup | None = None
    #: Whether the producer compresses (its codec may add a few bytes to a record).
    compressed: bool = True
    #: Add :data:`EPOCH_HEADER` to every record (``KafkaSink(epoch_header=True)``).
    epoch_header: bool = False

    def columns(self) -> dict[str, str | None]:
        """The options that name a column, and the column they name."""
        return {
            "key": self.key,
            "value": self.value,
            "headers": self.headers,
            "topic_column": self.topic_column,
            "partition_column": self.partition_column,
        }

    def evolving_value(self) -> AvroEncoder | None:
        """The value's Avro encoder when its schema follows the subject's versions: derived
        (no ``value_schema``) from the payload columns (no ``value=``) of one ``topic``. Only
        then does the sink compare and evolve schemas (:mod:`~txsink.connectors.kafka.evolve`):
        a given schema is the user's, a ``value=`` column leaves the other columns out of the
        record, and with ``topic_column`` each topic has a subject of its own."""
        encoder = self.avro.get("value")
        if encoder is None or encoder.given or self.value is not None or self.topic is None:
            return None
        return encoder

    def special_columns(self) -> list[str]:
        """The columns that are not in a value built from the payload columns."""
        return [
            c
            for c in (self.key, self.headers, self.topic_column, self.partition_column)
            if c is not None
        ]

    def payload_columns(self, names: Sequence[str]) -> list[str]:
        """The columns a value without ``value=`` is made of."""
        special = set(self.special_columns())
        return [c for c in names if c not in special]

    def encode(
        self,
        batch: pa.RecordBatch,
        partition: int,
        first_row: int,
        *,
        app: str = "",
        epoch: int = -1,
    ) -> pa.RecordBatch:
        """The Kafka records (:data:`RECORD_SCHEMA`) of ``batch``; ``first_row`` counts the
        partition's rows before it, for errors that name a row: by the ``key`` column's
        value (or the first columns), the partition and the offset in it (``redact_rows``:
        the column names and a hash only). With :attr:`epoch_header`, every record gets
        :data:`EPOCH_HEADER` of ``app`` and ``epoch`` last (not the partition: a replay that
        numbers its partitions otherwise must encode the same records)."""
        tag = epoch_tag(app, self.uid, epoch) if self.epoch_header and epoch >= 0 else None
        try:
            return self._encode(batch, partition, first_row, tag)
        except TxsinkError as err:
            at = err.row if isinstance(err.row, int) else getattr(err.row, "offset", None)
            if at is not None and 0 <= at - first_row < batch.num_rows:
                keys = (self.key,) if self.key else ()
                naming = RowNaming(keys, partition=partition, redact=self.redact_rows)
                err.row = naming.ref(batch, at - first_row, at)
            raise

    def _encode(
        self, batch: pa.RecordBatch, partition: int, first_row: int, tag: bytes | None = None
    ) -> pa.RecordBatch:
        n = batch.num_rows
        ctx: dict[str, Any] = {"sink_uid": self.uid, "partition": partition, "connector": "kafka"}
        topic = (
            batch.column(self.topic_column).cast(pa.string())
            if self.topic_column
            else pa.repeat(pa.scalar(self.topic, pa.string()), n)
        )
        if self.topic_column and topic.null_count:
            raise WriteError(
                f"topic_column {self.topic_column!r} is null",
                row=first_row + _first_null(topic),
                column=self.topic_column,
                **ctx,
            )
        value = self._value(batch, topic, first_row, ctx)
        if self.key is None:
            key = pa.nulls(n, pa.binary())
        elif "key" in self.avro:
            key = self.avro["key"].encode(
                batch.column(self.key), topic.to_pylist(), first_row, ctx, self.key
            )
        else:
            key = _to_binary(batch, self.key, first_row, ctx)
        part = (
            batch.column(self.partition_column).cast(pa.int32())
            if self.partition_column
            else pa.nulls(n, pa.int32())
        )
        headers = _headers(batch.column(self.headers)) if self.headers else pa.nulls(n, _HEADERS)
        if tag is not None:
            headers = _tagged(headers, tag)
        records = pa.RecordBatch.from_arrays(
            [topic, part, key, value, headers], schema=RECORD_SCHEMA
        )
        lookup = self.topics
        if lookup is not None and (self.topic_column or self.topic in lookup.known):
            check_records(
                records,
                lookup,
                compressed=self.compressed,
                first_row=first_row,
                ctx=ctx,
                columns=self.columns(),
            )
        else:
            self._check_sizes(records, first_row, ctx)
        return records

    def _value(
        self, batch: pa.RecordBatch, topic: pa.Array, first_row: int, ctx: dict[str, Any]
    ) -> pa.Array:
        payload = self.payload_columns(batch.schema.names)
        avro = self.avro.get("value")
        if avro is not None:
            column = (
                batch.column(self.value)
                if self.value is not None
                else pa.StructArray.from_arrays([batch.column(c) for c in payload], payload)
            )
            return avro.encode(
                column, topic.to_pylist(), first_row, ctx, self.value or "(payload columns)"
            )
        if self.value is not None:
            return _to_binary(batch, self.value, first_row, ctx)
        return pa.array(
            [r.encode() for r in json_rows(batch, payload, first_row=first_row, context=ctx)],
            pa.binary(),
        )

    def _check_sizes(self, records: pa.RecordBatch, first_row: int, ctx: dict[str, Any]) -> None:
        # Without the topic's description (the sink's check did not run): the cap alone.
        # Caught here, before the decision: once decided, a record the broker refuses
        # could never be committed.
        bound = largest_batch_size(
            records.column(2), records.column(3), records.column(4), compressed=self.compressed
        )
        if bound is not None and bound <= self.max_record_bytes:
            return  # even its longest key with its longest value fits
        sizes = batch_sizes(
            records.column(2), records.column(3), records.column(4), compressed=self.compressed
        )
        if len(sizes) and pc.max(sizes).as_py() > self.max_record_bytes:
            row = int(pc.index(pc.greater(sizes, self.max_record_bytes), True).as_py())
            raise WriteError(
                f"record of {sizes[row].as_py()} bytes as the broker counts it is larger than "
                f"max_record_bytes={self.max_record_bytes}; Kafka would refuse it after the "
                "decision. Shrink or split the value, or raise message.max.bytes on the "
                "producer and max.message.bytes on the topic",
                row=first_row + row,
                column=self.value or "value",
                **ctx,
            )


def _to_binary(batch: pa.RecordBatch, column: str, first_row: int, ctx: dict[str, Any]) -> pa.Array:
    arr = batch.column(column)
    if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
        return arr.cast(pa.binary())
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return arr.cast(pa.string()).cast(pa.binary())
    if pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
        return arr.cast(pa.string()).cast(pa.binary())
    rows = json_rows(
        pa.RecordBatch.from_arrays([arr], names=[column]), first_row=first_row, context=ctx
    )
    values = [json.dumps(json.loads(r)[column], separators=(",", ":")).encode() for r in rows]
    return pa.array(values, pa.binary())


def _headers(arr: pa.Array) -> pa.Array:
    out: list[list[dict[str, Any]] | None] = []
    for item in arr.to_pylist():
        if item is None:
            out.append(None)
            continue
        pairs = item.items() if isinstance(item, dict) else item
        out.append(
            [{"key": str(k), "value": v.encode() if isinstance(v, str) else v} for k, v in pairs]
        )
    return pa.array(out, _HEADERS)


def _tagged(headers: pa.Array, tag: bytes) -> pa.Array:
    """``headers`` with :data:`EPOCH_HEADER` ``tag`` appended to each record's list."""
    n = len(headers)
    ours = {"key": EPOCH_HEADER, "value": tag}
    if headers.null_count == n:  # no headers column (the usual case): one header each
        values = pa.array([ours] * n, _HEADERS.value_type)
        return pa.ListArray.from_arrays(pa.array(range(n + 1), pa.int32()), values)
    return pa.array([[*(item or ()), ours] for item in headers.to_pylist()], _HEADERS)


def _first_null(arr: pa.Array) -> int:
    return int(pc.index(pc.is_null(arr), True).as_py())
