"""The Avro encoder tells a registry that is away (transient) from a row that cannot be
encoded (the row's fault): the first is a RetryableError Spark may retry, the second a
WriteError naming the row. No servers: the registry is a closed port on 127.0.0.1."""

from __future__ import annotations

import json
import socket

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

from txsink.connectors.kafka.records.avro import AvroEncoder, registry_unavailable
from txsink.errors import RetryableError

SCHEMA = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed when the block ends: connections are refused


def test_an_unreachable_registry_is_retryable_and_names_the_row_and_column() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    encoder = AvroEncoder("value", {"url": url, "max.retries": 0}, SCHEMA, None)
    column = pa.array([{"a": 1}, {"a": 2}], pa.struct([("a", pa.int64())]))
    with pytest.raises(RetryableError, match="did not answer while encoding the value") as info:
        encoder.encode(column, ["t", "t"], 10, {"sink_uid": "s", "phase": "precommit"}, "v")
    assert (info.value.row, info.value.column, info.value.sink_uid) == (10, "v", "s")
    assert url in str(info.value)


@pytest.mark.parametrize(
    ("status", "transient"), [(503, True), (500, True), (422, False), (409, False)]
)
def test_registry_http_errors_are_transient_only_on_the_server_side(
    status: int, transient: bool
) -> None:
    assert registry_unavailable(SchemaRegistryError(status, 0, "x")) is transient


def test_an_encoding_error_is_not_transient() -> None:
    assert not registry_unavailable(ValueError("'x' is not a long"))
    assert registry_unavailable(ConnectionRefusedError(111, "refused"))
