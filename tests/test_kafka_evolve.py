"""Kafka's Avro values under schema evolution, without servers: the Avro schemas the sink
derives read back as Arrow (so a DataFrame compares as "no change" against the version it
registered), and a derived schema keeps the subject's latest version (so the replay of an
evolving epoch derives the same schema again)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.records.avro import avro_schema
from txsink.connectors.kafka.records.fromavro import planned, record_fields
from txsink.schema import diff

SPARK_LIKE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("small", pa.int16()),
        ("amount", pa.int32()),
        ("ratio", pa.float32()),
        ("price", pa.float64()),
        ("ok", pa.bool_()),
        ("name", pa.large_string()),
        ("blob", pa.binary()),
        ("day", pa.date32()),
        ("at", pa.timestamp("us", tz="Etc/UTC")),
        ("local", pa.timestamp("us")),
        ("money", pa.decimal128(12, 2)),
        ("tags", pa.list_(pa.field("element", pa.string()))),
        ("attrs", pa.map_(pa.string(), pa.int64())),
        ("inner", pa.struct([("a", pa.int32()), ("b", pa.list_(pa.struct([("c", pa.string())])))])),
    ]
)


def _derive(columns: pa.DataType) -> str:
    return json.dumps(avro_schema(columns, "t_value", nullable=False))


def test_a_derived_schema_reads_back_as_no_change() -> None:
    text = _derive(pa.struct(list(SPARK_LIKE)))
    fields = record_fields(text)
    assert fields is not None
    found = diff(fields, SPARK_LIKE)
    assert found.changes == () and found.refusals == ()
    # Deriving again from what was read back gives the very same schema (the same id).
    assert _derive(planned(fields, pa.struct(list(SPARK_LIKE)))) == text
    assert _derive(pa.struct(list(fields))) == text


def test_a_planned_schema_keeps_the_latest_order_and_types() -> None:
    latest = record_fields(_derive(pa.struct([("id", pa.int64()), ("amount", pa.int32())])))
    assert latest is not None
    evolved = pa.struct([("note", pa.string()), ("amount", pa.int64()), ("id", pa.int32())])
    shape = planned(latest, evolved)
    # latest's fields first (id keeps long: an int column is narrower), widened amount,
    # then the new column.
    assert [(f.name, f.type) for f in shape] == [
        ("id", pa.int64()),
        ("amount", pa.int64()),
        ("note", pa.string()),
    ]
    # The replay after the tasks registered it: the new latest derives itself again.
    again = record_fields(_derive(shape))
    assert _derive(planned(again, evolved)) == _derive(shape)
    # A column the epoch lacks stays in the schema (null), so no version drops a field.
    assert [f.name for f in planned(latest, pa.struct([("id", pa.int64())]))] == ["id", "amount"]


_ENUM = {"type": "enum", "name": "E", "symbols": ["a"]}


@pytest.mark.parametrize(
    "text",
    [
        '"string"',
        json.dumps({"type": "record", "name": "r", "fields": [{"name": "e", "type": _ENUM}]}),
        json.dumps(
            {"type": "record", "name": "r", "fields": [{"name": "u", "type": ["int", "string"]}]}
        ),
    ],
)
def test_schemas_txsink_does_not_derive_compare_nothing(text: str) -> None:
    assert record_fields(text) is None


def test_only_a_derived_avro_value_of_payload_columns_evolves() -> None:
    registry = {"url": "http://127.0.0.1:1"}
    base: dict[str, Any] = {
        "bootstrap_servers": "127.0.0.1:1",
        "topic": "t",
        "uid": "s",
        "wal": "/tmp/w",
    }
    derived = KafkaSink(**base, value_format="avro", schema_registry=registry)
    assert derived.evolution_support() == {"add", "add-field", "widen-int", "widen-float"}
    others = [
        KafkaSink(**base),
        KafkaSink(**base, value_format="avro", schema_registry=registry, value="v"),
        KafkaSink(**base, value_format="avro", schema_registry=registry, value_schema='"long"'),
    ]
    for sink in others:
        assert sink.evolution_support() == frozenset()
        assert sink.target_schema("app") is None  # nothing asked of any server


def test_the_tasks_write_batches_of_the_checked_shape_with_the_checked_schema() -> None:
    from txsink.connectors.kafka.records.avro import AvroEncoder

    encoder = AvroEncoder("value", {"url": "http://127.0.0.1:1"}, None, None, topic="orders")
    checked = pa.struct([("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))])
    text = encoder.resolve_schema(checked, "orders")
    assert json.loads(text)["name"] == "orders_value"
    # A batch whose time zone differs holds the same values: the checked schema.
    assert encoder.schema_for(pa.struct([("id", pa.int64()), ("at", pa.timestamp("us"))])) == text
    # An evolving epoch's batch (the check saw the columns the subject has): derived anew.
    wider = pa.struct(
        [("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC")), ("n", pa.string())]
    )
    assert [f["name"] for f in json.loads(encoder.schema_for(wider))["fields"]] == ["id", "at", "n"]
