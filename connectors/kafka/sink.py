"""Kafka connector: exactly-once into Kafka topics with transactions and a commit marker.

librdkafka cannot resume a prepared transaction from a new producer (KIP-939
is in no stable broker nor client), so a Kafka transaction cannot stay
"prepared" across the driver's decision and a crash. The pre-commit is made
durable elsewhere, and the Kafka transaction is the commit::

    write    each task serialises its rows to Kafka records (key, value, headers, topic,
             partition) and checks their size
    prepare  the records go to a write-ahead log file (Arrow IPC, fsynced) under ``wal``;
             the handle names it
    commit   (per shard, in finish_epoch) init_transactions on the shard's stable
             transactional.id, which fences any zombie with that id; read the shard's
             marker; if it already says this epoch, do nothing; else produce the shard's
             records AND the new marker in one transaction, commit, delete the WAL files
    abort    delete the WAL file
    recover  WAL files of this app and sink that no decision names

The marker is a record keyed ``<app>/<uid>/<shard>`` in a compacted marker
topic (default ``txsink-markers``), written inside the same transaction as the
records: it never expires (consumer-group offsets do, after 7 days by
default) and a ``read_committed`` read shows it exactly when the records are
visible. A shard is ``partition % shards`` of the Spark partition that wrote
the records, fixed in the decision, so a restart with another number of Spark
partitions commits exactly what was decided.

Replay mode (``mode="replay"``) writes no WAL: the epoch is resharded into
``shards`` tasks by Spark's stable hash of ``shard_by`` (default: the key); the
pre-commit records each shard's record count and an order-independent
checksum; the commit is a second job over the same (persisted) rows, one task
per shard, that produces and writes the marker in one transaction, and
refuses with :class:`~txsink.errors.NonDeterministicReplayError` if the
replayed shard differs from what was decided. After a crash, only the replay
of the same epoch (Spark re-running the batch) can commit it.

Guarantee: exactly-once for consumers with ``isolation.level=read_committed``
(``read_uncommitted`` consumers can see records of aborted transactions).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
from typing_extensions import override

from txsink._fs import fsync_dir
from txsink._json import json_rows
from txsink.connectors.kafka.avro import AvroEncoder
from txsink.errors import (
    CommitError,
    ConfigurationError,
    FencedError,
    NonDeterministicReplayError,
    RetryableError,
    TxsinkError,
    WriteError,
)
from txsink.handles import Handle, register_handle
from txsink.log import LogStore
from txsink.sink import EpochCommit, Partitioning, TaskInfo, TwoPhaseCommitSink
from txsink.txid import TxnId

__all__ = ["RECORD_SCHEMA", "KafkaReplayHandle", "KafkaSink", "KafkaWalHandle"]

_log = logging.getLogger(__name__)

RECORD_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
_ENFORCED = {"enable.idempotence": True, "acks": "all"}
_CHECKSUM_VERSION = 2
_MIN_TXN_TIMEOUT_MS = 10_000


@register_handle
@dataclass(frozen=True)
class KafkaWalHandle(Handle):
    """Records of one task, durable in the write-ahead log; ``path`` is relative to ``wal``."""

    serializer: ClassVar[str] = "kafka.wal"
    version: ClassVar[int] = 1

    path: str = ""
    crc32: int = 0


@register_handle
@dataclass(frozen=True)
class KafkaReplayHandle(Handle):
    """A shard's count and checksum at pre-commit (replay mode: no data stored)."""

    serializer: ClassVar[str] = "kafka.replay"
    version: ClassVar[int] = 2

    shards: int = 1
    checksum: int = 0
    #: 1: topic, key, value (txsink <= 0.1); 2: also partition, headers and nulls.
    checksum_version: int = _CHECKSUM_VERSION

    @classmethod
    @override
    def decode(cls, version: int, data: dict[str, Any]) -> KafkaReplayHandle:
        if version == 1:  # decided by an older txsink: verify its replay the old way
            return super().decode(cls.version, {**data, "checksum_version": 1})
        return super().decode(version, data)


@dataclass
class _OpenWal:
    txn: TxnId
    folder: Path | None
    writer: Any = None
    rows: int = 0
    nbytes: int = 0
    checksum: int = 0


@dataclass
class _Marker:
    epoch: int
    offset: int


@dataclass
class _DriverState:
    """Driver-only state: producers per shard (initialised once) and known markers."""

    producers: dict[int, Any] = field(default_factory=dict)
    markers: dict[int, int] = field(default_factory=dict)  # -1: read, none yet
    admin: Any = None
    delivery_errors: dict[int, list[str]] = field(default_factory=dict)
    checked: bool = False


class KafkaSink(TwoPhaseCommitSink[_OpenWal, Any]):
    """Exactly-once records into Kafka.

    Args:
        bootstrap_servers: the brokers.
        topic: the target topic (or None with ``topic_column``).
        uid: the sink's stable id.
        wal: the write-ahead log folder, on a filesystem the driver and every
            executor share (like the files connector's output).
        shards: how many transactional ids (and markers) share the commit;
            stable across epochs, one producer each on the driver.
        key, value: the key and value columns. Binary is taken as is, strings
            UTF-8 encoded, anything else as JSON. Without ``value`` the value is a
            JSON object of every column that is not key, headers, topic or partition.
        key_format, value_format: ``"auto"`` (as above) or ``"avro"``: Confluent
            Avro with ``AvroSerializer`` (needs ``schema_registry``); the value
            record is the ``value`` column (a struct, or any type) or, without
            ``value``, a record of the payload columns.
        schema_registry: ``SchemaRegistryClient`` settings (``{"url": ...}``, auth,
            TLS), passed through untouched, never logged.
        key_schema, value_schema: Avro schemas (JSON strings); default: derived
            from the columns' types (:func:`~txsink.connectors.kafka.avro.avro_schema`).
        avro_config: ``AvroSerializer`` settings (``auto.register.schemas``,
            ``subject.name.strategy``, ...).
        headers: a ``map<string, string|binary>`` column of record headers.
        topic_column, partition_column: per-row topic / Kafka partition (fan-out).
        transactional_id_prefix: transactional ids are ``<prefix>-<uid>-<shard>``.
        marker_topic: the compacted marker topic (created if missing).
        producer_config: extra librdkafka settings (TLS, SASL, linger.ms,
            compression.type, ...), passed through untouched except that
            ``enable.idempotence`` and ``acks=all`` are enforced.
        max_record_bytes: refuse records larger than this in pre-commit
            (default: the producer's ``message.max.bytes``, 1 MB).
        log: the txsink log, to use the sink alone as ``foreachBatch(sink)``.
    """

    connector: ClassVar[str] = "kafka"
    handle_type: ClassVar[type[Handle]] = KafkaWalHandle

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str | None,
        uid: str,
        *,
        wal: str | os.PathLike[str] | None = None,
        mode: Literal["wal", "replay"] = "wal",
        shard_by: Sequence[str] | None = None,
        shards: int = 1,
        key: str | None = None,
        value: str | None = None,
        headers: str | None = None,
        topic_column: str | None = None,
        partition_column: str | None = None,
        key_format: Literal["auto", "avro"] = "auto",
        value_format: Literal["auto", "avro"] = "auto",
        schema_registry: Mapping[str, Any] | None = None,
        key_schema: str | None = None,
        value_schema: str | None = None,
        avro_config: Mapping[str, Any] | None = None,
        transactional_id_prefix: str = "txsink",
        marker_topic: str = "txsink-markers",
        producer_config: dict[str, Any] | None = None,
        max_record_bytes: int | None = None,
        timeout_s: float = 30.0,
        log: str | LogStore | None = None,
        **coordinator_options: Any,
    ) -> None:
        super().__init__(uid, log=log, **coordinator_options)
        if mode not in ("wal", "replay"):
            raise ValueError(f"KafkaSink mode must be 'wal' or 'replay', got {mode!r}")
        if mode == "wal" and wal is None:
            raise ValueError(
                "KafkaSink(mode='wal') needs wal='<folder shared by driver and executors>'"
            )
        self.shard_by = tuple(shard_by) if shard_by else ((key,) if key else ())
        if mode == "replay" and not self.shard_by:
            raise ValueError(
                "KafkaSink(mode='replay') needs key=... or shard_by=[...]: rows are "
                "resharded by a stable hash of those columns"
            )
        if topic is None and topic_column is None:
            raise ValueError("KafkaSink needs topic=... or topic_column=...")
        if shards < 1:
            raise ValueError("shards must be >= 1")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.wal = os.path.abspath(os.fspath(wal)) if wal is not None else ""
        self.mode = mode
        self.shards = shards
        self.key = key
        self.value = value
        self.headers = headers
        self.topic_column = topic_column
        self.partition_column = partition_column
        self.prefix = transactional_id_prefix
        self.marker_topic = marker_topic
        self.producer_config = dict(producer_config or {})
        for name, wanted in _ENFORCED.items():
            given = self.producer_config.get(name)
            if given is not None and str(given).lower() != str(wanted).lower():
                raise ValueError(f"KafkaSink enforces {name}={wanted} (got {given!r})")
        self.max_record_bytes = max_record_bytes or int(
            self.producer_config.get("message.max.bytes", 1_000_000)
        )
        self.timeout_s = timeout_s
        self._avro: dict[str, AvroEncoder] = {}
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
                self._avro[field_] = AvroEncoder(field_, schema_registry, schema_, avro_config)
        self._driver = _DriverState()

    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_driver"] = _DriverState()  # producers stay on the driver
        return state

    @property
    @override
    def commits_from_data(self) -> bool:
        return self.mode == "replay"

    @override
    def required_partitioning(self) -> Partitioning | None:
        # Replay: one task per shard, rows by a stable hash, so each shard's rows
        # can be re-read by one task after a crash (Spark does not promise the
        # same rows in the same partition otherwise, SPARK-28650).
        if self.mode == "replay":
            return Partitioning(self.shard_by, self.shards)
        return None

    def transactional_id(self, shard: int) -> str:
        return f"{self.prefix}-{self.uid}-{shard}"

    def _client_config(self) -> dict[str, Any]:
        # Security settings (TLS/SASL) pass through; producer tuning does not matter here.
        conf = {
            k: v
            for k, v in self.producer_config.items()
            if k.startswith(("security.", "ssl.", "sasl.", "client.", "socket."))
        }
        conf["bootstrap.servers"] = self.bootstrap_servers
        conf["logger"] = _quiet_logger()
        return conf

    # -- driver: start -------------------------------------------------------------

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        from confluent_kafka.admin import AdminClient

        ctx: dict[str, Any] = {"sink_uid": self.uid, "connector": "kafka", "phase": "check"}
        for name, column in (
            ("key", self.key),
            ("value", self.value),
            ("headers", self.headers),
            ("topic_column", self.topic_column),
            ("partition_column", self.partition_column),
        ):
            if column is not None and column not in schema.names:
                raise ConfigurationError(
                    f"{name}={column!r} is not a column of the DataFrame (columns: {schema.names})",
                    column=column,
                    **ctx,
                )
        try:
            if self.mode == "wal":
                os.makedirs(self.wal, exist_ok=True)
        except OSError as err:
            raise ConfigurationError(
                f"cannot create the WAL folder {self.wal}: {err.strerror}", **ctx
            ) from err
        admin = AdminClient(self._client_config())
        try:
            meta = admin.list_topics(timeout=self.timeout_s)
        except Exception as err:
            raise RetryableError(
                f"cannot reach Kafka at {self.bootstrap_servers}: {err}", **ctx
            ) from err
        if self.topic is not None and self.topic not in meta.topics:
            raise ConfigurationError(
                f"topic {self.topic!r} does not exist: create it (txsink does not create data "
                "topics, their partitions and retention are yours to choose)",
                **ctx,
            )
        self._check_transaction_timeout(admin, meta, ctx)
        self._ensure_marker_topic(admin, meta, ctx)
        self._check_avro(schema, ctx)
        # Initialise every shard's producer now: it fences zombies and aborts any
        # transaction they left open, so read_committed readers are not held back.
        # In parallel: each init_transactions waits on the broker (GIL released).
        with ThreadPoolExecutor(max_workers=min(8, self.shards)) as pool:
            list(pool.map(self._producer, range(self.shards)))
        if self.mode == "replay":  # tasks produce; the driver's producers only fenced
            self._close_producers()
        self._driver.checked = True

    def _check_avro(self, schema: pa.Schema, ctx: dict[str, Any]) -> None:
        """Fix and register the Avro schemas now: a bad one fails at start, not in a task."""
        for field_, encoder in self._avro.items():
            column = self.key if field_ == "key" else self.value
            arrow_type = (
                schema.field(column).type
                if column is not None
                else pa.struct([schema.field(n) for n in self._payload_columns(schema.names)])
            )
            try:
                encoder.resolve_schema(arrow_type, self.topic)
            except ValueError as err:
                raise ConfigurationError(
                    f"cannot derive an Avro {field_} schema from column "
                    f"{column or '(payload columns)'!r}: {err}. Pass {field_}_schema='<Avro JSON>' "
                    "or cast the column",
                    column=column,
                    **ctx,
                ) from err
            if self.topic is not None:  # with topic_column, tasks register per topic
                encoder.register(self.topic, ctx)

    def _payload_columns(self, names: Sequence[str]) -> list[str]:
        """The columns a value without ``value=`` is made of."""
        special = {
            c
            for c in (self.key, self.headers, self.topic_column, self.partition_column)
            if c is not None
        }
        return [c for c in names if c not in special]

    def _close_producers(self) -> None:
        for producer in self._driver.producers.values():
            producer.flush(0)
        self._driver.producers.clear()
        self._driver.markers.clear()

    def _check_transaction_timeout(self, admin: Any, meta: Any, ctx: dict[str, Any]) -> None:
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ConfigResource,
            ResourceType,
        )

        ours = int(self.producer_config.get("transaction.timeout.ms", 60_000))
        if ours < _MIN_TXN_TIMEOUT_MS:
            raise ConfigurationError(
                f"transaction.timeout.ms={ours} is too short: an epoch's commit produces all of a "
                f"shard's records in one transaction; use at least {_MIN_TXN_TIMEOUT_MS}",
                **ctx,
            )
        broker = str(next(iter(meta.brokers)))
        res = ConfigResource(ResourceType.BROKER, broker)
        configs = admin.describe_configs([res])[res].result(timeout=self.timeout_s)
        entry = configs.get("transaction.max.timeout.ms")
        limit = int(entry.value) if entry is not None and entry.value else None
        if limit is not None and ours > limit:
            raise ConfigurationError(
                f"transaction.timeout.ms={ours} is above the broker's "
                f"transaction.max.timeout.ms={limit}: the broker would refuse every transaction. "
                "Lower transaction.timeout.ms in producer_config, or raise the broker setting",
                **ctx,
            )

    def _ensure_marker_topic(self, admin: Any, meta: Any, ctx: dict[str, Any]) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ConfigResource,
            NewTopic,
            ResourceType,
        )

        if self.marker_topic not in meta.topics:
            replicas = min(3, len(meta.brokers))
            topic = NewTopic(
                self.marker_topic,
                num_partitions=1,
                replication_factor=replicas,
                config={
                    "cleanup.policy": "compact",
                    "segment.ms": "3600000",
                    "min.cleanable.dirty.ratio": "0.1",
                },
            )
            try:
                admin.create_topics([topic])[self.marker_topic].result(timeout=self.timeout_s)
            except KafkaException as err:
                if err.args[0].code() != _error_code("TOPIC_ALREADY_EXISTS"):
                    raise ConfigurationError(
                        f"cannot create the marker topic {self.marker_topic!r}: {err}. Create it "
                        "with cleanup.policy=compact, or grant CREATE",
                        **ctx,
                    ) from err
            return
        res = ConfigResource(ResourceType.TOPIC, self.marker_topic)
        policy = (
            admin.describe_configs([res])[res].result(timeout=self.timeout_s).get("cleanup.policy")
        )
        if policy is None or policy.value.replace(" ", "") != "compact":
            raise ConfigurationError(
                f"marker topic {self.marker_topic!r} has cleanup.policy="
                f"{getattr(policy, 'value', None)!r}: markers would expire and an old epoch "
                "could be written twice. Use a topic with cleanup.policy=compact only",
                **ctx,
            )

    # -- executor: write and prepare -----------------------------------------------

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> _OpenWal:
        if self.mode == "replay":
            return _OpenWal(txn, None)
        folder = Path(self.wal, str(txn))
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return _OpenWal(txn, folder)

    @override
    def write(self, txn: _OpenWal, batch: pa.RecordBatch) -> None:
        records = self._records(batch, txn.txn.partition, txn.rows)
        if txn.folder is None:  # replay: remember what the commit must find again
            txn.checksum = (txn.checksum + _checksum(records, _CHECKSUM_VERSION)) % _MOD
        else:
            if txn.writer is None:
                txn.writer = pa.ipc.new_file(str(txn.folder / "records.arrow"), RECORD_SCHEMA)
            txn.writer.write_batch(records)
        txn.rows += records.num_rows
        txn.nbytes += records.nbytes

    def _records(self, batch: pa.RecordBatch, partition: int, first_row: int) -> pa.RecordBatch:
        n = batch.num_rows
        ctx: dict[str, Any] = {
            "sink_uid": self.uid,
            "partition": partition,
            "connector": "kafka",
        }
        topic = (
            batch.column(self.topic_column).cast(pa.string())
            if self.topic_column
            else pa.array([self.topic] * n, pa.string())
        )
        if self.topic_column and topic.null_count:
            raise WriteError(
                f"topic_column {self.topic_column!r} is null",
                row=first_row + _first_null(topic),
                column=self.topic_column,
                **ctx,
            )
        payload = self._payload_columns(batch.schema.names)
        avro = self._avro.get("value")
        if avro is not None:
            column = (
                batch.column(self.value)
                if self.value is not None
                else pa.StructArray.from_arrays([batch.column(c) for c in payload], payload)
            )
            value = avro.encode(
                column, topic.to_pylist(), first_row, ctx, self.value or "(payload columns)"
            )
        elif self.value is not None:
            value = _to_binary(batch, self.value, first_row, ctx)
        else:
            value = pa.array(
                [r.encode() for r in json_rows(batch, payload, first_row=first_row, context=ctx)],
                pa.binary(),
            )
        if self.key is None:
            key = pa.nulls(n, pa.binary())
        elif "key" in self._avro:
            key = self._avro["key"].encode(
                batch.column(self.key), topic.to_pylist(), first_row, ctx, self.key
            )
        else:
            key = _to_binary(batch, self.key, first_row, ctx)
        partition = (
            batch.column(self.partition_column).cast(pa.int32())
            if self.partition_column
            else pa.nulls(n, pa.int32())
        )
        headers = (
            _headers(batch.column(self.headers))
            if self.headers
            else pa.nulls(n, RECORD_SCHEMA.field("headers").type)
        )
        self._check_sizes(key, value, first_row, ctx)
        return pa.RecordBatch.from_arrays(
            [topic, partition, key, value, headers], schema=RECORD_SCHEMA
        )

    def _check_sizes(
        self, key: pa.Array, value: pa.Array, first_row: int, ctx: dict[str, Any]
    ) -> None:
        # Caught here, before the decision: once decided, a record the broker
        # refuses could never be committed.
        sizes = pc.add(
            pc.fill_null(pc.binary_length(value), 0), pc.fill_null(pc.binary_length(key), 0)
        )
        if len(sizes) and pc.max(sizes).as_py() > self.max_record_bytes:
            row = int(pc.index(pc.greater(sizes, self.max_record_bytes), True).as_py())
            raise WriteError(
                f"record of {sizes[row].as_py()} bytes is larger than max_record_bytes="
                f"{self.max_record_bytes} (the producer's message.max.bytes); the broker would "
                "refuse it after the decision. Shrink or split the value, or raise "
                "message.max.bytes on the producer, the topic (max.message.bytes) and the broker",
                row=first_row + row,
                column=self.value or "value",
                **ctx,
            )

    @override
    def prepare(self, txn: _OpenWal) -> KafkaWalHandle | KafkaReplayHandle:
        if txn.folder is None:
            return KafkaReplayHandle(
                txn=txn.txn,
                rows=txn.rows,
                nbytes=txn.nbytes,
                shards=self.shards,
                checksum=txn.checksum,
            )
        path = txn.folder / "records.arrow"
        if txn.writer is not None:
            txn.writer.close()
        crc = 0
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                crc = zlib.crc32(chunk, crc)
            os.fsync(f.fileno())
        fsync_dir(txn.folder)
        fsync_dir(txn.folder.parent)
        return KafkaWalHandle(
            txn=txn.txn,
            rows=txn.rows,
            nbytes=txn.nbytes,
            path=f"{txn.txn}/records.arrow",
            crc32=crc,
        )

    @override
    def discard(self, txn: _OpenWal) -> None:
        if txn.writer is not None:
            with contextlib.suppress(Exception):  # the folder goes anyway
                txn.writer.close()
        if txn.folder is not None:
            shutil.rmtree(txn.folder, ignore_errors=True)

    # -- driver: commit --------------------------------------------------------------

    @override
    def commit_epoch(self, request: EpochCommit[Any]) -> None:
        """One Kafka transaction per shard (records and marker); a shard is the unit."""
        if self.mode == "replay":
            self._commit_replay(request)
            return
        handles = request.handles
        if not handles:
            return
        by_shard: dict[int, list[KafkaWalHandle]] = defaultdict(list)
        for h in handles:
            by_shard[h.txn.partition % self.shards].append(h)
        for shard in by_shard:
            self._producer(shard)  # init_transactions before reading markers: fences zombies
        unread = [shard for shard in sorted(by_shard) if shard not in self._driver.markers]
        if unread:
            self._driver.markers.update(self._read_markers(handles[0].txn.app, unread))
        for shard in sorted(by_shard):
            mine = sorted(by_shard[shard], key=lambda h: h.txn)
            self._commit_shard(shard, request.epoch, mine)
            request.committed(mine)

    def _commit_shard(self, shard: int, epoch: int, handles: list[KafkaWalHandle]) -> None:

        app = handles[0].txn.app
        producer = self._producer(shard)
        marker = self._marker(shard, app)
        if marker is not None and marker >= epoch:
            self._delete_wal(handles)  # committed before a crash: verified by the marker
            return
        missing = [h.path for h in handles if not Path(self.wal, h.path).exists()]
        if missing:
            # The cached marker may be stale: another driver (this one's successor, if
            # this driver was frozen and is a zombie now) may have committed the epoch
            # and deleted its WAL files since. Read the marker again before calling
            # them lost.
            fresh = self._read_markers(app, [shard])[shard]
            self._driver.markers[shard] = fresh
            if fresh >= epoch:
                _log.info(
                    "[uid=%s epoch=%s] Kafka shard %s: epoch already committed by another "
                    "driver (marker: epoch %s); nothing to do",
                    self.uid,
                    epoch,
                    shard,
                    fresh,
                )
                return
            marker = None if fresh < 0 else fresh
        if not missing:
            self._verify_wal(epoch, handles)
        if missing:
            raise CommitError(
                f"cannot commit epoch {epoch} shard {shard}: WAL files {missing} are gone and the "
                f"shard's marker says epoch {marker}, so their records are lost. Was the WAL "
                f"folder {self.wal} cleaned by hand?",
                sink_uid=self.uid,
                epoch=epoch,
                connector="kafka",
                phase="commit",
            )

        def body() -> None:
            for h in handles:
                self._produce_wal(producer, h)

        self._transaction(producer, app, shard, epoch, body)
        self._driver.markers[shard] = epoch
        self._delete_wal(handles)

    def _commit_replay(self, request: EpochCommit[Any]) -> None:
        """Replay mode: one task per shard re-reads its rows, checks them, produces, commits."""
        epoch, handles, data = request.epoch, request.handles, request.data
        if not handles:
            return
        if data is None:  # pragma: no cover - the coordinator refuses before calling
            raise CommitError("replay mode commits from the epoch's rows", epoch=epoch)
        decided: dict[int, tuple[int, int, int]] = {}
        for h in handles:
            if h.shards != self.shards:
                raise ConfigurationError(
                    f"epoch {epoch} was decided with shards={h.shards}, this sink has "
                    f"shards={self.shards}: set shards={h.shards} until that epoch is committed",
                    sink_uid=self.uid,
                    epoch=epoch,
                    connector="kafka",
                )
            decided[h.txn.partition] = (h.rows, h.checksum, h.checksum_version)
        app = handles[0].txn.app
        data.map_partitions(
            functools.partial(
                _replay_commit_task, sink=self, app=app, epoch=epoch, decided=decided
            )
        )
        request.committed(handles)

    def _commit_shard_rows(
        self,
        shard: int,
        app: str,
        epoch: int,
        want: tuple[int, int, int],
        batches: Iterator[pa.RecordBatch],
    ) -> tuple[str, int]:
        """In a replay commit task: produce ``shard``'s rows and its marker, once."""

        producer = self._producer(shard)
        marker = self._marker(shard, app)
        if marker is not None and marker >= epoch:
            return "already-committed", 0
        count = [0, 0]  # rows, checksum

        def body() -> None:
            for batch in batches:
                records = self._records(batch, shard, count[0])
                count[1] = (count[1] + _checksum(records, want[2])) % _MOD
                count[0] += records.num_rows
                self._produce_batch(producer, records)
            if tuple(count) != want[:2]:
                raise NonDeterministicReplayError(
                    f"the replay of epoch {epoch} gives shard {shard} {count[0]} records "
                    f"(checksum {count[1]}), but its pre-commit recorded {want[0]} (checksum "
                    f"{want[1]}): the source or a transformation is not deterministic. Nothing "
                    "was written. Use mode='wal' for this query (the WAL keeps the decided "
                    "records), or make the input deterministic",
                    sink_uid=self.uid,
                    epoch=epoch,
                    partition=shard,
                    connector="kafka",
                    phase="commit",
                )

        self._transaction(producer, app, shard, epoch, body)
        rows = count[0]
        return "committed", rows

    def _transaction(
        self,
        producer: Any,
        app: str,
        shard: int,
        epoch: int,
        body: Callable[[], None],
    ) -> None:
        """One Kafka transaction: ``body`` produces the records, then the marker; commit.

        Any failure aborts the transaction, so nothing of it is visible and no
        transaction is left open to hold ``read_committed`` readers back.
        """
        from confluent_kafka import KafkaException

        errors = self._driver.delivery_errors.setdefault(shard, [])
        errors.clear()

        marker = {
            "app": app,
            "uid": self.uid,
            "shard": shard,
            "shards": self.shards,
            "epoch": epoch,
            "at": time.time(),
        }
        started = time.monotonic()
        try:
            producer.begin_transaction()
            body()
            producer.produce(
                self.marker_topic,
                key=_marker_key(app, self.uid, shard).encode(),
                value=json.dumps(marker).encode(),
                partition=0,
            )
            self._commit_transaction(producer)
        except KafkaException as err:
            # Drop the producer and the cached marker: the next attempt re-initialises
            # (which completes or aborts whatever this one left at the broker) and reads
            # the marker again; the marker, not this outcome, says whether it committed.
            kerr = err.args[0]
            self._driver.producers.pop(shard, None)
            self._driver.markers.pop(shard, None)
            if not kerr.fatal():
                with contextlib.suppress(KafkaException):
                    producer.abort_transaction(self.timeout_s)
            elapsed = time.monotonic() - started
            raise self._map(kerr, epoch, shard, errors, elapsed) from err
        except BaseException:
            try:
                producer.abort_transaction(self.timeout_s)
            except KafkaException:
                self._driver.producers.pop(shard, None)
                self._driver.markers.pop(shard, None)
            raise
        self._driver.markers[shard] = epoch
        self._warn_if_slow(shard, epoch, time.monotonic() - started)

    def _commit_transaction(self, producer: Any) -> None:
        """``commit_transaction``, retried on retriable errors as librdkafka asks."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                return
            except KafkaException as err:
                if not err.args[0].retriable() or time.monotonic() >= deadline:
                    raise

    def _txn_timeout_s(self) -> float:
        return int(self.producer_config.get("transaction.timeout.ms", 60_000)) / 1000

    def _warn_if_slow(self, shard: int, epoch: int, elapsed: float) -> None:
        limit = self._txn_timeout_s()
        if elapsed > limit / 2:
            _log.warning(
                "[uid=%s epoch=%s] Kafka shard %s: the commit transaction took %.1fs, over half "
                "of transaction.timeout.ms (%.0fs); the broker aborts longer ones and the commit "
                "would then fail on every retry. Raise transaction.timeout.ms (up to the "
                "broker's transaction.max.timeout.ms) or use more shards",
                self.uid,
                epoch,
                shard,
                elapsed,
                limit,
                extra={"txsink_uid": self.uid, "txsink_epoch": epoch},
            )

    def _verify_wal(self, epoch: int, handles: Sequence[KafkaWalHandle]) -> None:
        """Refuse to commit WAL files that differ from what the pre-commit wrote.

        A torn or corrupted file could otherwise commit fewer or other records than
        were decided; the CRC was taken after the fsync, before the decision.
        """
        for h in handles:
            if not h.crc32:
                continue  # a listed (not decided) handle: never committed
            crc = 0
            with open(Path(self.wal, h.path), "rb") as f:
                while chunk := f.read(1 << 20):
                    crc = zlib.crc32(chunk, crc)
            if crc != h.crc32:
                raise CommitError(
                    f"WAL file {Path(self.wal, h.path)} is corrupted (crc32 {crc:#010x}, the "
                    f"pre-commit recorded {h.crc32:#010x}): its records cannot be committed as "
                    "decided. Restore the file from a backup of the WAL folder if you have one; "
                    "otherwise the epoch's records of this task are lost",
                    sink_uid=self.uid,
                    epoch=epoch,
                    partition=h.txn.partition,
                    connector="kafka",
                    phase="commit",
                )

    def _produce_wal(self, producer: Any, handle: KafkaWalHandle) -> None:
        with pa.memory_map(str(Path(self.wal, handle.path))) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                self._produce_batch(producer, reader.get_batch(i))

    @staticmethod
    def _produce_batch(producer: Any, batch: pa.RecordBatch) -> None:
        """Hand one batch of records to the producer (the hot loop of every commit).

        Positional arguments and no per-record callback: the producers report
        failed deliveries only (``delivery.report.only.error``), and any failure
        also fails ``commit_transaction``.
        """
        produce = producer.produce
        topics, parts, keys, values, headers = (c.to_pylist() for c in batch.columns)
        n = len(batch)
        simple = batch.column(1).null_count == n and batch.column(4).null_count == n
        for i, (topic, key, value) in enumerate(zip(topics, keys, values, strict=True)):
            while True:
                try:
                    if simple:
                        produce(topic, value, key)
                    else:
                        hs = [(h["key"], h["value"]) for h in headers[i] or ()] or None
                        part = parts[i]
                        produce(topic, value, key, -1 if part is None else part, headers=hs)
                    break
                except BufferError:
                    producer.poll(0.05)  # local queue full: let deliveries drain
        producer.poll(0)

    def _producer(self, shard: int) -> Any:
        from confluent_kafka import KafkaException, Producer

        producer = self._driver.producers.get(shard)
        if producer is not None:
            return producer
        conf = {
            "linger.ms": 20,
            "compression.type": "lz4",
            "partitioner": "murmur2_random",
            **self.producer_config,
            **_ENFORCED,
            "bootstrap.servers": self.bootstrap_servers,
            "transactional.id": self.transactional_id(shard),
            "logger": _quiet_logger(),
            "delivery.report.only.error": True,
            "on_delivery": functools.partial(
                _on_failed_delivery, self._driver.delivery_errors.setdefault(shard, [])
            ),
        }
        producer = Producer(conf)
        try:
            producer.init_transactions(self.timeout_s)
        except KafkaException as err:
            raise self._map(err.args[0], None, shard, [], init=True) from err
        self._driver.producers[shard] = producer
        self._driver.markers.pop(shard, None)  # read it again under the new producer epoch
        return producer

    def _marker(self, shard: int, app: str) -> int | None:
        """The last committed epoch of ``shard`` for ``app`` (call after init_transactions)."""
        if shard not in self._driver.markers:
            self._driver.markers.update(self._read_markers(app, [shard]))
        found = self._driver.markers[shard]
        return None if found < 0 else found

    def _read_markers(self, app: str, shards: Sequence[int]) -> dict[int, int]:
        """Read the markers of ``shards`` (-1: none) from the marker topic, read_committed.

        Complete up to the marker topic's end as of this call: first wait until the
        partition's last stable offset reaches its high watermark. Another producer's
        transaction left open on the shared marker topic (another query mid-commit, a
        dead one until its transaction times out) holds the last stable offset below
        markers committed after it; a read that stopped there would miss our newest
        marker and commit that epoch again.
        """
        from confluent_kafka import Consumer, IsolationLevel, KafkaError, TopicPartition

        ctx: dict[str, Any] = {"sink_uid": self.uid, "connector": "kafka", "phase": "commit"}
        tp = TopicPartition(self.marker_topic, 0)
        deadline = time.monotonic() + self.timeout_s
        end = self._end_offset(tp, IsolationLevel.READ_UNCOMMITTED)
        while (stable := self._end_offset(tp, IsolationLevel.READ_COMMITTED)) < end:
            if time.monotonic() > deadline:
                raise RetryableError(
                    f"marker topic {self.marker_topic!r}: a transaction of another producer has "
                    f"been open for over {self.timeout_s:.0f}s (last stable offset {stable}, end "
                    f"{end}), so the markers cannot be read completely. It ends when that "
                    "producer commits or its transaction.timeout.ms passes; retry then",
                    **ctx,
                )
            time.sleep(0.05)
        wanted = {_marker_key(app, self.uid, s).encode(): s for s in shards}
        found = dict.fromkeys(shards, -1)
        if end == 0:
            return found
        consumer = Consumer(
            {
                **self._client_config(),
                "group.id": f"txsink-marker-{self.uid}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
            }
        )
        try:
            consumer.assign([TopicPartition(self.marker_topic, 0, 0)])
            while True:
                msg = consumer.poll(max(0.0, deadline - time.monotonic()))
                if msg is None:
                    raise RetryableError(
                        f"timed out reading marker topic {self.marker_topic!r}", **ctx
                    )
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise RetryableError(
                            f"cannot read marker topic {self.marker_topic!r}: {err.str()}", **ctx
                        )
                    if (msg.offset() or 0) >= end:  # EOF sits at the last stable offset
                        break
                    continue
                shard = wanted.get(msg.key() or b"")
                if shard is not None and msg.value() is not None:
                    found[shard] = int(json.loads(msg.value() or b"{}")["epoch"])
        finally:
            consumer.close()
        return found

    def _end_offset(self, tp: Any, isolation: Any) -> int:
        from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

        if self._driver.admin is None:
            self._driver.admin = AdminClient(self._client_config())
        latest: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = self._driver.admin.list_offsets({tp: latest}, isolation_level=isolation)
        return int(next(iter(futures.values())).result(timeout=self.timeout_s).offset)

    # -- driver: abort, recover ------------------------------------------------------

    @override
    def abort(self, handle: Any) -> None:
        if self.mode == "wal":
            shutil.rmtree(Path(self.wal, str(handle.txn)), ignore_errors=True)

    @override
    def list_prepared(self, app_id: str) -> Iterator[KafkaWalHandle]:
        if self.mode == "replay":
            return  # nothing is prepared outside Kafka; check() aborted open transactions
        try:
            names = os.listdir(self.wal)
        except FileNotFoundError:
            return
        for name in sorted(names):
            txn = TxnId.try_parse(name)
            if txn is not None and txn.belongs_to(app_id, self.uid):
                yield KafkaWalHandle(txn=txn, path=f"{name}/records.arrow")

    @override
    def migrate_uid(self, old: str, *, app_id: str, dry_run: bool = False) -> list[str]:
        """Fence the old transactional ids: init_transactions aborts an open transaction a
        dead producer left (it would hold ``read_committed`` readers back) and fences a
        zombie. The old markers stay as history."""
        ids = [f"{self.prefix}-{old}-{shard}" for shard in range(self.shards)]
        if not dry_run:
            from confluent_kafka import Producer

            for tid in ids:
                conf = {
                    **self.producer_config,
                    "bootstrap.servers": self.bootstrap_servers,
                    "transactional.id": tid,
                    "enable.idempotence": True,
                    "acks": "all",
                }
                Producer(conf).init_transactions(self.timeout_s)
        verb = "would fence" if dry_run else "fenced"
        return [
            f"{self!r}: {verb} transactional ids {ids}; markers {app_id}/{old}/<shard> stay in "
            f"{self.marker_topic!r} as history (the first epoch under {self.uid!r} writes its "
            "own)"
        ]

    def _delete_wal(self, handles: Sequence[KafkaWalHandle]) -> None:
        for h in handles:
            shutil.rmtree(Path(self.wal, str(h.txn)), ignore_errors=True)

    # -- errors ----------------------------------------------------------------------

    def _map(
        self,
        err: Any,
        epoch: int | None,
        shard: int,
        delivery: list[str],
        elapsed: float = 0.0,
        *,
        init: bool = False,
    ) -> TxsinkError:
        """Map a KafkaError by code (never by message text)."""
        ctx: dict[str, Any] = {
            "sink_uid": self.uid,
            "epoch": epoch,
            "connector": "kafka",
            "phase": "commit",
        }
        code = err.code()
        detail = f"{err.str()}" + (f"; first delivery error: {delivery[0]}" if delivery else "")
        if elapsed >= 0.9 * self._txn_timeout_s():
            detail += (
                f"; the transaction ran {elapsed:.0f}s, about transaction.timeout.ms "
                f"({self._txn_timeout_s():.0f}s), so the broker aborted it: raise "
                "transaction.timeout.ms or use more shards"
            )
        if code in (
            _error_code("_FENCED"),
            _error_code("PRODUCER_FENCED"),
            _error_code("INVALID_PRODUCER_EPOCH"),
        ):
            return FencedError(
                f"transactional id {self.transactional_id(shard)!r} was taken over by another "
                "producer: another live query (or a zombie driver) writes with the same "
                f"transactional_id_prefix and uid. Give each query its own prefix or uid "
                f"({detail})",
                **ctx,
            )
        if code == _error_code("TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            return ConfigurationError(
                f"not authorised to use transactional id {self.transactional_id(shard)!r}: "
                f"grant WRITE on TransactionalId {self.prefix}-* ({detail})",
                **ctx,
            )
        if init and code in (
            _error_code("_TIMED_OUT"),
            _error_code("COORDINATOR_NOT_AVAILABLE"),
            _error_code("_UNSUPPORTED_FEATURE"),
            _error_code("UNSUPPORTED_VERSION"),
        ):
            detail += (
                f"; init_transactions for {self.transactional_id(shard)!r} did not complete: "
                "the brokers must support transactions (Kafka >= 2.5) and run the transaction "
                "coordinator, i.e. transaction.state.log.replication.factor and "
                "transaction.state.log.min.isr no larger than the number of live brokers"
            )
        if err.retriable() or code == _error_code("_TIMED_OUT"):
            return RetryableError(f"Kafka shard {shard}: {detail}", **ctx)
        return CommitError(
            f"Kafka shard {shard}: {detail}; the decision stands and recovery retries the commit",
            **ctx,
        )

    @override
    def __repr__(self) -> str:
        return (
            f"KafkaSink(uid={self.uid!r}, topic={self.topic!r}, "
            f"bootstrap_servers={self.bootstrap_servers!r}, shards={self.shards})"
        )


_MOD = 1 << 64


def _checksum(records: pa.RecordBatch, version: int) -> int:
    """Order-independent checksum of records (Spark does not keep row order in a replay).

    A sum of per-record CRCs: rows may come back in any order and any batching.
    Version 2 covers every field that reaches Kafka (topic, partition, key,
    value, headers) and tells a null key or value from an empty one.
    """
    total = 0
    cols = [records.column(i).to_pylist() for i in range(records.num_columns)]
    for topic, partition, key, value, headers in zip(*cols, strict=True):
        if version == 1:
            h = zlib.crc32(value or b"", zlib.crc32(key or b"", zlib.crc32(topic.encode())))
        else:
            h = zlib.crc32(topic.encode())
            h = zlib.crc32(
                b"\xff" if partition is None else partition.to_bytes(4, "big", signed=True), h
            )
            h = zlib.crc32(b"\x00" if key is None else b"\x01" + key, h)
            h = zlib.crc32(b"\x00" if value is None else b"\x01" + value, h)
            for header in headers or ():
                h = zlib.crc32(header["value"] or b"", zlib.crc32(header["key"].encode(), h))
        total += h * 2654435761 + len(value or b"")
    return total % _MOD


def _replay_commit_task(
    task: TaskInfo,
    batches: Iterator[pa.RecordBatch],
    *,
    sink: KafkaSink,
    app: str,
    epoch: int,
    decided: dict[int, tuple[int, int, int]],
) -> tuple[str, int]:
    """One replay commit task: the shard is the task's partition (the epoch was resharded)."""
    shard = task.partition
    return sink._commit_shard_rows(
        shard, app, epoch, decided.get(shard, (0, 0, _CHECKSUM_VERSION)), batches
    )


def _on_failed_delivery(errors: list[str], err: Any, msg: Any) -> None:
    """Producer-wide delivery callback (failures only): keep the first, with its context."""
    if err is not None and not errors:
        errors.append(f"{err.str()} (topic {msg.topic()} partition {msg.partition()})")


def _error_code(name: str) -> int:
    from confluent_kafka import KafkaError

    return int(getattr(KafkaError, name))


def _marker_key(app: str, uid: str, shard: int) -> str:
    return f"{app}/{uid}/{shard}"


def _quiet_logger() -> logging.Logger:
    logger = logging.getLogger("txsink.connectors.kafka.librdkafka")
    logger.setLevel(logging.ERROR)
    return logger


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
    return pa.array(out, RECORD_SCHEMA.field("headers").type)


def _first_null(arr: pa.Array) -> int:
    return int(pc.index(pc.is_null(arr), True).as_py())
