"""Smoke tests: the real servers support exactly what txsink's connectors rely on.

If one of these fails, connector tests against that server mean nothing: Kafka must hide
aborted transactions from read_committed readers, Postgres must keep a prepared
transaction across connections, S3 must keep multipart uploads invisible until completed
and honour ``If-None-Match: *``, the schema registry must serve confluent-kafka's Avro
serializers. The proxy tests check the fault-injection tool itself.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from _services.fixtures import KafkaService, PostgresService, RegistryService, S3Service
from botocore.exceptions import ClientError
from psycopg import errors
from readback import (
    count_prepared,
    fetch_rows,
    list_multipart_uploads,
    list_objects,
    read_object,
    read_topic,
    read_values,
)

from txsink.testing.netproxy import NetProxy

# -- Kafka ------------------------------------------------------------------------------


@pytest.mark.kafka
def test_kafka_committed_visible_aborted_invisible(kafka: KafkaService) -> None:
    from confluent_kafka import Producer

    topic = kafka.new_topic(partitions=2)
    producer = Producer(kafka.config(**{"transactional.id": kafka.new_transactional_id()}))
    producer.init_transactions(30)

    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, value=f"committed-{i}".encode(), partition=i % 2)
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic, value=f"aborted-{i}".encode(), partition=i % 2)
    producer.flush(30)
    producer.abort_transaction(30)

    committed = read_values(kafka.bootstrap, topic)
    assert sorted(v or b"" for v in committed) == [f"committed-{i}".encode() for i in range(6)]
    # The aborted records were really written: an uncommitted reader sees them.
    everything = read_values(kafka.bootstrap, topic, isolation="read_uncommitted")
    assert len(everything) == 10


@pytest.mark.kafka
def test_kafka_open_transaction_does_not_block_readback(kafka: KafkaService) -> None:
    """read_topic stops at the last stable offset instead of waiting for an open transaction."""
    from confluent_kafka import Producer

    topic = kafka.new_topic()
    producer = Producer(kafka.config(**{"transactional.id": kafka.new_transactional_id()}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"done")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"pending")
    producer.flush(30)
    try:
        assert [r.value for r in read_topic(kafka.bootstrap, topic, timeout_s=20)] == [b"done"]
    finally:
        producer.abort_transaction(30)


# -- Schema Registry --------------------------------------------------------------------

ROW_SCHEMA = {
    "type": "record",
    "name": "Row",
    "namespace": "txsink.smoke",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "score", "type": ["null", "double"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


@pytest.mark.registry
@pytest.mark.kafka
def test_registry_avro_roundtrip_through_kafka(
    schema_registry: RegistryService, kafka: KafkaService
) -> None:
    """Register a schema, serialize with it, produce, consume, deserialize with a new client."""
    import json

    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = kafka.new_topic()
    subject = schema_registry.topic_subject(topic)
    client = schema_registry.client()
    schema_str = json.dumps(ROW_SCHEMA)
    schema_id = client.register_schema(subject, Schema(schema_str, "AVRO"))
    assert subject in (client.get_subjects() or [])
    assert client.get_latest_version(subject).schema_id == schema_id

    # auto.register off: the serializer must find the registered schema by lookup.
    serializer = AvroSerializer(client, schema_str, conf={"auto.register.schemas": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    rows = [
        {"id": 1, "name": "a", "score": 1.5, "tags": ["x"]},
        {"id": 2, "name": "b", "score": None, "tags": []},
    ]
    producer = Producer(kafka.config())
    for row in rows:
        producer.produce(topic, value=serializer(row, ctx))
    assert producer.flush(30) == 0

    values = [r.value for r in read_topic(kafka.bootstrap, topic)]
    assert len(values) == 2
    for value in values:  # Confluent wire format: magic byte 0, then the schema id
        assert value is not None and value[0] == 0
        assert int.from_bytes(value[1:5], "big") == schema_id
    # A fresh client has no cached schemas: the id must resolve on the server.
    deserializer = AvroDeserializer(schema_registry.client())
    assert [deserializer(v, ctx) for v in values] == rows


# -- Postgres ---------------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_prepared_transaction_committed_from_new_connection(
    postgres: PostgresService,
) -> None:
    schema = postgres.new_schema()
    dsn = postgres.dsn_for_schema(schema)
    with postgres.connect(dsn=dsn) as conn:
        max_prepared = conn.execute("SHOW max_prepared_transactions").fetchone()
        assert max_prepared is not None and int(max_prepared[0]) > 0
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")

    gid = f"txsink-smoke-{schema}"
    first = psycopg.connect(dsn)
    first.tpc_begin(gid)  # a plain string gid: stored verbatim in pg_prepared_xacts
    first.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    first.tpc_prepare()
    first.close()  # the prepared transaction outlives its connection

    assert count_prepared(postgres.dsn, gid) == 1
    assert fetch_rows(dsn, "SELECT count(*) FROM t") == [(0,)]

    second = psycopg.connect(dsn)
    try:
        recovered = [x for x in second.tpc_recover() if x.gtrid == gid]
        assert len(recovered) == 1
        second.tpc_commit(recovered[0])
        assert fetch_rows(dsn, "SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "b")]
        assert count_prepared(postgres.dsn, gid) == 0
        # Committing twice is an error, not a no-op: "already committed" must be verified.
        with pytest.raises(errors.UndefinedObject):
            second.tpc_commit(recovered[0])
    finally:
        second.close()


@pytest.mark.postgres
def test_postgres_schema_cleanup_survives_lingering_prepared_transaction(
    postgres: PostgresService,
) -> None:
    """A test that leaves a prepared transaction behind must not hang the schema drop."""
    schema = postgres.new_schema()
    dsn = postgres.dsn_for_schema(schema)
    with postgres.connect(dsn=dsn) as conn:
        conn.execute("CREATE TABLE t (id int)")
    conn2 = psycopg.connect(dsn)
    conn2.tpc_begin(f"txsink-linger-{schema}")
    conn2.execute("INSERT INTO t VALUES (1)")
    conn2.tpc_prepare()
    conn2.close()
    started = time.monotonic()
    postgres.cleanup()
    assert time.monotonic() - started < 10
    assert count_prepared(postgres.dsn, f"txsink-linger-{schema}") == 0


# -- S3 ---------------------------------------------------------------------------------

PART = b"x" * (5 * 1024 * 1024)  # S3's minimum size for every part but the last


@pytest.mark.s3
def test_s3_multipart_invisible_until_complete_and_abort_removes(s3: S3Service) -> None:
    client = s3.client()
    bucket = s3.new_bucket()

    upload = client.create_multipart_upload(Bucket=bucket, Key="epoch-1/part-0.jsonl")
    uid = upload["UploadId"]
    etag1 = client.upload_part(
        Bucket=bucket, Key="epoch-1/part-0.jsonl", UploadId=uid, PartNumber=1, Body=PART
    )["ETag"]
    etag2 = client.upload_part(
        Bucket=bucket, Key="epoch-1/part-0.jsonl", UploadId=uid, PartNumber=2, Body=b"tail"
    )["ETag"]
    assert list_objects(client, bucket) == []
    assert [u.upload_id for u in list_multipart_uploads(client, bucket, "epoch-1/")] == [uid]

    client.complete_multipart_upload(
        Bucket=bucket,
        Key="epoch-1/part-0.jsonl",
        UploadId=uid,
        MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": etag1}, {"PartNumber": 2, "ETag": etag2}]
        },
    )
    assert list_objects(client, bucket) == ["epoch-1/part-0.jsonl"]
    assert read_object(client, bucket, "epoch-1/part-0.jsonl") == PART + b"tail"
    assert list_multipart_uploads(client, bucket) == []

    doomed = client.create_multipart_upload(Bucket=bucket, Key="epoch-2/part-0.jsonl")
    client.upload_part(
        Bucket=bucket,
        Key="epoch-2/part-0.jsonl",
        UploadId=doomed["UploadId"],
        PartNumber=1,
        Body=b"never",
    )
    assert len(list_multipart_uploads(client, bucket, "epoch-2/")) == 1
    client.abort_multipart_upload(
        Bucket=bucket, Key="epoch-2/part-0.jsonl", UploadId=doomed["UploadId"]
    )
    assert list_multipart_uploads(client, bucket, "epoch-2/") == []
    assert list_objects(client, bucket, "epoch-2/") == []


@pytest.mark.s3
def test_s3_conditional_put_if_none_match(s3: S3Service) -> None:
    client = s3.client()
    bucket = s3.new_bucket()
    client.put_object(Bucket=bucket, Key="_decisions/epoch-7", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=bucket, Key="_decisions/epoch-7", Body=b"second", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert read_object(client, bucket, "_decisions/epoch-7") == b"first"


# -- the fault-injection proxy ----------------------------------------------------------


@contextlib.contextmanager
def echo_server() -> Iterator[int]:
    """A tiny threaded TCP echo server on loopback; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        listener.close()


def _roundtrip(port: int, payload: bytes, timeout: float = 2.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        return _recv_exactly(sock, len(payload))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def test_netproxy_forward_stall_slow_cut_heal() -> None:
    with echo_server() as port, NetProxy("127.0.0.1", port) as proxy:
        assert _roundtrip(proxy.port, b"hello") == b"hello"
        assert proxy.stats.bytes_to_server >= 5

        # stall: a live connection stays open but nothing arrives until heal
        live = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        proxy.stall()
        live.sendall(b"held")
        live.settimeout(0.5)
        with pytest.raises(TimeoutError):
            live.recv(10)
        proxy.heal()
        live.settimeout(5)
        assert _recv_exactly(live, 4) == b"held"

        # slow: every chunk is delayed in each direction
        proxy.slow(0.3)
        started = time.monotonic()
        assert _roundtrip(proxy.port, b"slow", timeout=5) == b"slow"
        assert time.monotonic() - started >= 0.55
        proxy.heal()

        # cut: live connections are reset, new ones refused
        proxy.cut()
        live.settimeout(2)
        with pytest.raises((ConnectionResetError, BrokenPipeError, OSError)):
            live.sendall(b"x")
            if not live.recv(10):
                raise ConnectionResetError("closed")
        live.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2)

        # heal: the same port forwards again
        proxy.heal()
        assert _roundtrip(proxy.port, b"again") == b"again"


def test_netproxy_many_connections_and_large_payload() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    with echo_server() as port, NetProxy("127.0.0.1", port) as proxy:
        results: list[bool] = []

        def one() -> None:
            results.append(_roundtrip(proxy.port, payload, timeout=10) == payload)

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert results == [True] * 8


@pytest.mark.postgres
def test_postgres_through_proxy_cut_and_heal(postgres: PostgresService) -> None:
    proxy, dsn = postgres.with_proxy()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        proxy.cut()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)
    proxy.heal()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)


@pytest.mark.kafka
def test_kafka_through_proxy_listener(kafka: KafkaService) -> None:
    """All traffic of a client bootstrapped through the proxy goes through it."""
    from confluent_kafka import Producer

    topic = kafka.new_topic()
    proxy, bootstrap = kafka.with_proxy()
    producer = Producer(kafka.config(**{"bootstrap.servers": bootstrap}))
    producer.produce(topic, value=b"via-proxy")
    assert producer.flush(30) == 0
    before = proxy.stats.bytes_to_server
    producer.produce(topic, value=b"second")
    assert producer.flush(30) == 0
    assert proxy.stats.bytes_to_server > before  # not bypassing the proxy after bootstrap
    assert sorted(v or b"" for v in read_values(kafka.bootstrap, topic)) == [
        b"second",
        b"via-proxy",
    ]


@pytest.mark.s3
def test_s3_through_proxy_stall(s3: S3Service) -> None:
    bucket = s3.new_bucket()
    proxy, endpoint = s3.with_proxy()
    client = s3.client(endpoint, retries={"max_attempts": 1}, read_timeout=1)
    client.put_object(Bucket=bucket, Key="a", Body=b"1")
    proxy.stall()
    with pytest.raises(Exception):  # noqa: B017 - botocore raises ReadTimeoutError subclasses
        client.get_object(Bucket=bucket, Key="a")
    proxy.heal()
    assert read_object(client, bucket, "a") == b"1"
