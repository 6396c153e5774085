"""Kafka connector: exactly-once into Kafka topics with transactions and a commit marker.

librdkafka cannot resume a prepared transaction from a new producer (KIP-939 is in no
stable broker nor client), so a Kafka transaction cannot stay "prepared" across the
driver's decision and a crash. The pre-commit is made durable elsewhere, and the Kafka
transaction is the commit::

    write    each task serialises its rows to Kafka records (key, value, headers, topic,
             partition) and checks their size                        (records/format.py)
    prepare  WAL mode: the records go to a write-ahead log file (Arrow IPC), published
             whole under ``wal``: a shared folder or an object store (wal/store.py); the
             handle names it and its CRC32                                 (wal/task.py)
             replay mode: the handle holds the shard's count and checksum (replay/)
    commit   commit_epoch, one Spark task per shard: init_transactions on the shard's
             stable transactional.id, which fences any zombie with that id
             (clients/producers.py); read the shard's marker (clients/markers.py); if it
             already says this epoch, do nothing; else produce the shard's records AND
             the new marker in one transaction and commit; the shards are reported
             committed once the tasks returned                              (wal/log.py)
    abort    delete the WAL file
    recover  WAL files of this app and sink that no decision names

The marker is a record keyed ``<app>/<uid>/<shard>`` in a compacted marker topic (default
``txsink-markers``), written inside the same transaction as the records: it never expires
(consumer-group offsets do, after 7 days by default) and a ``read_committed`` read shows
it exactly when the records are visible. In WAL mode a shard is ``partition % shards`` of
the Spark partition that wrote the records, fixed in the decision, so a restart with
another number of Spark partitions commits exactly what was decided.

Direct mode (``mode="direct"``, :mod:`~txsink.connectors.kafka.direct`) is one pass: each
Spark task's own producer holds the epoch's transaction open while the driver decides, then
commits it; a shard whose task could not commit after the decision is committed from the
epoch's replay, verified as in replay mode.

Replay mode (``mode="replay"``) writes no WAL: the epoch is resharded into ``shards``
tasks by Spark's stable hash of ``shard_by`` (default: the key); the commit is a second
job over the same (persisted) rows, one task per shard, that refuses with
:class:`~txsink.errors.NonDeterministicReplayError` if the replayed shard differs from what
was decided. After a crash, only the replay of the same epoch (Spark re-running the batch)
can commit it.

Guarantee: exactly-once for consumers with ``isolation.level=read_committed``
(``read_uncommitted`` consumers can see records of aborted transactions).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeAlias

import pyarrow as pa
from typing_extensions import override

from txsink.audit.found import AuditRequest, TargetAudit
from txsink.connectors.kafka import audit, checks, direct, evolve, replay
from txsink.connectors.kafka.clients.markers import Markers
from txsink.connectors.kafka.clients.producers import ShardProducers, fence
from txsink.connectors.kafka.clients.settings import ENFORCED, KafkaSettings
from txsink.connectors.kafka.direct import KafkaDirectHandle, OpenDirect, open_direct
from txsink.connectors.kafka.records.format import RecordFormat, avro_encoders
from txsink.connectors.kafka.records.limits import DEFAULT_PRODUCER_MAX
from txsink.connectors.kafka.records.topics import TopicLookup
from txsink.connectors.kafka.replay import KafkaReplayHandle, OpenReplay
from txsink.connectors.kafka.rights import check_rights
from txsink.connectors.kafka.wal import KafkaWalHandle, OpenWal, WriteAheadLog
from txsink.connectors.kafka.wal.store import WalStore
from txsink.handles import Handle
from txsink.schema import SchemaChange
from txsink.sink import EpochCommit, Partitioning, TwoPhaseCommitSink
from txsink.store import LogStore
from txsink.txid import TxnId

__all__ = ["KafkaHandle", "KafkaSink", "OpenTxn"]

#: A task's open transaction: a WAL file (WAL mode), a tally (replay mode) or a Kafka
#: transaction (direct mode).
OpenTxn: TypeAlias = OpenWal | OpenReplay | OpenDirect
KafkaHandle: TypeAlias = KafkaWalHandle | KafkaReplayHandle | KafkaDirectHandle
Mode: TypeAlias = Literal["wal", "replay", "direct"]


class KafkaSink(TwoPhaseCommitSink[OpenTxn, Any]):
    """Exactly-once records into Kafka.

    Args:
        bootstrap_servers: the brokers.
        topic: the target topic (or None with ``topic_column``).
        uid: the sink's stable id.
        wal: where the write-ahead log lives: a folder the driver and every executor
            share (like the files connector's output), or any ``pyarrow.fs`` URL they
            all reach (``s3://bucket/prefix``, ``gs://...``).
        wal_options: keyword arguments of the ``pyarrow.fs`` filesystem of ``wal``'s
            scheme (``S3FileSystem(endpoint_override=..., scheme=..., region=...,
            access_key=..., secret_key=...)``), passed through untouched, never logged
            nor persisted. Without them: ``pyarrow.fs.FileSystem.from_uri(wal)`` (the
            AWS environment chain for S3).
        wal_filesystem: a ready ``pyarrow.fs.FileSystem`` instead of ``wal_options``
            (``wal`` is then a path in it).
        mode: ``"wal"`` (default), ``"replay"`` (no WAL) or ``"direct"`` (single pass:
            the tasks' producers commit; see the module docs).
        shard_by: replay mode: the columns rows are resharded by (default: ``key``).
        shards: how many transactional ids (and markers) share the commit;
            stable across epochs; each commits in a Spark task of its own. Direct mode:
            the most Spark partitions an epoch may have (default 8; each partition is a
            shard, its transactional id fenced at every start).
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
            from the columns' types (:func:`~txsink.connectors.kafka.records.avro.avro_schema`).
        avro_config: ``AvroSerializer`` settings (``auto.register.schemas``,
            ``subject.name.strategy``, ...).
        headers: a ``map<string, string|binary>`` column of record headers.
        topic_column, partition_column: per-row topic / Kafka partition (fan-out).
        transactional_id_prefix: transactional ids are ``<prefix>-<uid>-<shard>``.
        marker_topic: the compacted marker topic (created if missing). Default:
            ``txsink-markers``, shared by queries; in direct mode
            ``<transactional_id_prefix>-markers-<uid>``, the sink's own, because a
            direct-mode epoch holds a transaction open on it for the whole epoch and
            every ``read_committed`` marker read of a sharing query would wait on it.
        producer_config: extra librdkafka settings (TLS, SASL, linger.ms,
            compression.type, ...), passed through untouched except that
            ``enable.idempotence`` and ``acks=all`` are enforced.
        max_record_bytes: refuse records whose batch (as the broker counts it: key,
            value, headers and the record batch header) is larger than this, in the
            pre-commit. Default: the smallest of the topic's ``max.message.bytes`` (read
            at the check; per topic with ``topic_column``) and the producer's
            ``message.max.bytes``; a value above them is refused at the check.
        timeout_s: how long a call to the brokers may take.
        redact_rows: name a rejected row in errors by its column names and a hash of its
            values only (for sensitive data; default: the ``key`` column's value, or the
            first columns').
        epoch_header: add a ``txsink.epoch`` header (``<app>/<uid>/<epoch>``) to every record,
            by which ``txsink audit`` finds each epoch's records (docs/connectors/kafka.md).
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
        wal_options: Mapping[str, Any] | None = None,
        wal_filesystem: Any = None,
        mode: Mode = "wal",
        shard_by: Sequence[str] | None = None,
        shards: int | None = None,
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
        marker_topic: str | None = None,
        producer_config: dict[str, Any] | None = None,
        max_record_bytes: int | None = None,
        timeout_s: float = 30.0,
        redact_rows: bool = False,
        epoch_header: bool = False,
        log: str | LogStore | None = None,
        **coordinator_options: Any,
    ) -> None:
        super().__init__(uid, log=log, **coordinator_options)
        if mode not in ("wal", "replay", "direct"):
            raise ValueError(f"KafkaSink mode must be 'wal', 'replay' or 'direct', got {mode!r}")
        if shards is None:
            shards = 8 if mode == "direct" else 1
        if mode == "wal" and wal is None:
            raise ValueError(
                "KafkaSink(mode='wal') needs wal='<folder shared by driver and executors, or "
                "s3://bucket/prefix>'"
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
        if wal is not None and "://" in os.fspath(wal):
            _refuse_credentials_in(os.fspath(wal))
        self._wal = WriteAheadLog(
            WalStore(os.fspath(wal) if wal is not None else ".", wal_options, wal_filesystem)
        )
        #: The WAL location: an absolute folder, or a URL (never with credentials).
        self.wal = self._wal.store.url if wal is not None else ""
        self.mode = mode
        self.shards = shards
        self.prefix = transactional_id_prefix
        self.marker_topic = marker_topic or _default_marker_topic(mode, self.prefix, self.uid)
        self.producer_config = dict(producer_config or {})
        for name, wanted in ENFORCED.items():
            given = self.producer_config.get(name)
            if given is not None and str(given).lower() != str(wanted).lower():
                raise ValueError(f"KafkaSink enforces {name}={wanted} (got {given!r})")
        self.timeout_s = timeout_s
        producer_max = int(self.producer_config.get("message.max.bytes", DEFAULT_PRODUCER_MAX))
        #: The producers' ``batch.size`` cap, so a batch of several records fits the topic
        #: (set by the check from the topic's limit; docs/connectors/kafka.md).
        self._batch_cap: int | None = None
        self.records = RecordFormat(
            uid=self.uid,
            topic=topic,
            key=key,
            value=value,
            headers=headers,
            topic_column=topic_column,
            partition_column=partition_column,
            max_record_bytes=max_record_bytes or producer_max,
            redact_rows=redact_rows,
            avro=avro_encoders(
                topic=topic,
                key=key,
                key_format=key_format,
                value_format=value_format,
                key_schema=key_schema,
                value_schema=value_schema,
                schema_registry=schema_registry,
                avro_config=avro_config,
            ),
            compressed=str(self.producer_config.get("compression.type", "lz4")).lower() != "none",
            epoch_header=epoch_header,
        )
        self.records = dataclasses.replace(
            self.records,
            topics=TopicLookup(
                self.settings, explicit_max=max_record_bytes, producer_max=producer_max
            ),
        )
        self._clients: ShardProducers | None = None
        #: Direct mode: which pooled producers the tasks may reuse (new at each check:
        #: the check fences every transactional id, so older producers are fenced).
        self._generation = ""

    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_clients"] = None  # producers stay in the process that made them
        return state

    @override
    def release(self) -> None:
        clients, self._clients = self._clients, None
        if clients is not None:
            clients.close()

    @property
    def settings(self) -> KafkaSettings:
        """How this sink's clients reach the brokers, and as whom."""
        return KafkaSettings(
            bootstrap_servers=self.bootstrap_servers, uid=self.uid, prefix=self.prefix,
            marker_topic=self.marker_topic, shards=self.shards, timeout_s=self.timeout_s,
            producer_config=self.producer_config, batch_cap=self._batch_cap,
        )  # fmt: skip

    @property
    def _producers(self) -> ShardProducers:
        """This process's per-shard producers (and the markers they saw), made on first use."""
        if self._clients is None:
            self._clients = ShardProducers(self.settings)
        return self._clients

    def transactional_id(self, shard: int) -> str:
        return self.settings.transactional_id(shard)

    @property
    @override
    def commits_from_data(self) -> bool:
        return self.mode in ("replay", "direct")

    @property
    @override
    def commits_in_task(self) -> bool:
        return self.mode == "direct"

    @override
    def required_partitioning(self) -> Partitioning | None:
        # Replay: one task per shard, rows by a stable hash, so each shard's rows
        # can be re-read by one task after a crash (Spark does not promise the
        # same rows in the same partition otherwise, SPARK-28650).
        if self.mode == "replay":
            return Partitioning(self.shard_by, self.shards)
        return None

    # -- driver: start -------------------------------------------------------------

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        ctx = self.settings.context("check")
        checks.check_columns(schema, self.records, ctx)
        if self.mode == "wal":
            self._wal.check(ctx)
        cluster = checks.list_cluster(self.settings)  # once: brokers down are told first
        check_rights(self.settings, self.topic, cluster, ctx)  # every missing ACL, named
        cluster = checks.check_brokers(self.settings, self.topic, cluster, ctx)
        self._batch_cap = checks.check_topics(self.settings, self.records, cluster, ctx)
        checks.check_avro(schema, self.records, ctx)
        # Fence zombies and abort the transactions they left open, so read_committed
        # readers are not held back by a crashed run. Commit tasks produce (their own
        # producers); the driver's producers only fenced.
        self.release()  # producers made before the check know no batch cap
        self._producers.init_all(phase="check")
        self.release()
        self._generation = uuid.uuid4().hex

    # -- driver: schema evolution (Avro values only; see evolve.py) -----------------------

    @override
    def target_schema(self, app_id: str) -> pa.Schema | None:
        return evolve.target_schema(self.records, self.settings.context("check"))

    @override
    def evolution_support(self) -> frozenset[str]:
        return evolve.SUPPORTED if self.records.evolving_value() is not None else frozenset()

    @override
    def prepare_evolution(self, change: SchemaChange, app_id: str) -> None:
        # Tests the new version with the registry; the tasks register it as they encode.
        evolve.prepare(change, self.records, self.uid, self.settings.context("check"))

    # -- executor: write and prepare -----------------------------------------------

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> OpenTxn:
        if self.mode == "replay":
            return OpenReplay(txn)
        if self.mode == "direct":
            return open_direct(self.settings, txn, self._generation)
        return self._wal.open(txn)

    @override
    def write(self, txn: OpenTxn, batch: pa.RecordBatch) -> None:
        t = txn.txn
        txn.write(self.records.encode(batch, t.partition, txn.rows, app=t.app, epoch=t.epoch))

    @override
    def prepare(self, txn: OpenTxn) -> KafkaHandle:
        if isinstance(txn, OpenReplay):
            return txn.prepare(self.shards)
        return txn.prepare()

    @override
    def discard(self, txn: OpenTxn) -> None:
        if isinstance(txn, (OpenWal, OpenDirect)):
            txn.discard()

    @override
    def commit_in_task(self, txn: OpenTxn) -> None:
        if not isinstance(txn, OpenDirect):  # pragma: no cover - only direct mode holds one
            raise TypeError(f"{self!r} commits in its tasks in direct mode only")
        txn.commit()

    # -- driver: commit, abort, recover -----------------------------------------------

    @override
    def commit_epoch(self, request: EpochCommit[Any]) -> None:
        """One Kafka transaction per shard (records and marker); a shard is the unit.

        Both modes commit in one task per shard, in parallel, and report the shards
        committed once the tasks returned (so the ``during_commit`` crash point fires
        after every shard committed, never between two). WAL mode without a cluster
        (``request.tasks`` is ``local_tasks``: ``txsink recover``): the driver commits
        shard after shard with its own producers and reports each one as it committed.
        """
        started = time.monotonic()
        if self.mode == "replay":
            replay.commit_epoch(request, self.settings, self.records)
        elif self.mode == "direct":
            direct.commit_leftovers(request, self.settings, self.records)
            self._generation = uuid.uuid4().hex  # its tasks fenced pooled producers
            return  # its transactions began in the pre-commit tasks: not measured here
        else:
            self._wal.commit_epoch(request, self.settings, lambda: self._producers)
        if request.handles:
            # Each shard's transaction begins and commits inside this call: its span bounds
            # them all from above (docs/observability.md, commit_timeout_ratio).
            elapsed = time.monotonic() - started
            request.report_timeout_ratio(elapsed / self.settings.txn_timeout_s)

    @override
    def abort(self, handle: Any) -> None:
        if self.mode == "wal":
            self._wal.delete([handle])
        elif isinstance(handle, KafkaDirectHandle):
            # Its task aborted it or died: a new producer on the id aborts whatever is open.
            fence(self.settings, [self.transactional_id(handle.shard)], phase="abort")
            self._generation = uuid.uuid4().hex

    @override
    def recorded_epoch(self, app_id: str) -> int | None:
        found = Markers(self.settings).read(app_id, range(self.shards), phase="recover")
        newest = max(found.values(), default=-1)
        return None if newest < 0 else newest

    @override
    def list_prepared(self, app_id: str) -> Iterator[KafkaWalHandle]:
        if self.mode != "wal":
            return iter(())  # nothing is prepared outside Kafka; check() aborted open ones
        return self._wal.list_prepared(app_id, self.uid)

    @override
    def audit(self, request: AuditRequest) -> TargetAudit:
        return audit.audit_topic(request, self.settings, self.records, self.mode)

    @property
    @override
    def auditable(self) -> bool:  # epochs are told apart by their header, one topic only
        return self.records.epoch_header and self.records.topic_column is None

    @override
    def migrate_uid(self, old: str, *, app_id: str, dry_run: bool = False) -> list[str]:
        """Fence the old transactional ids: init_transactions aborts an open transaction a
        dead producer left (it would hold ``read_committed`` readers back) and fences a
        zombie. The old markers stay as history."""
        before = dataclasses.replace(self.settings, uid=old)
        ids = [before.transactional_id(shard) for shard in range(self.shards)]
        if not dry_run:
            fence(self.settings, ids, phase="migrate")
        verb = "would fence" if dry_run else "fenced"
        return [
            f"{self!r}: {verb} transactional ids {ids}; markers {app_id}/{old}/<shard> stay in "
            f"{self.marker_topic!r} as history (the first epoch under {self.uid!r} writes its "
            "own)"
        ]

    @override
    def __repr__(self) -> str:
        return (
            f"KafkaSink(uid={self.uid!r}, topic={self.topic!r}, "
            f"bootstrap_servers={self.bootstrap_servers!r}, shards={self.shards})"
        )


#: Kafka's legal topic names.
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


#: The marker topic every WAL- and replay-mode sink shares unless told another.
SHARED_MARKER_TOPIC = "txsink-markers"


def _default_marker_topic(mode: str, prefix: str, uid: str) -> str:
    """``txsink-markers`` (shared), or in direct mode the sink's own topic: a direct-mode
    epoch's transactions stay open on the marker topic until the decision, and every
    ``read_committed`` read of a marker topic waits for the transactions open on it."""
    if mode != "direct":
        return SHARED_MARKER_TOPIC
    name = f"{prefix}-markers-{uid}"
    if not _TOPIC_NAME.fullmatch(name):
        raise ValueError(
            f"KafkaSink(mode='direct') names its marker topic {name!r} after "
            "transactional_id_prefix and uid, which is not a legal Kafka topic name: pass "
            "marker_topic='<name of letters, digits, ., _ and - only>'"
        )
    return name


def _refuse_credentials_in(url: str) -> None:
    """A ``wal`` URL is shown in errors and logs: credentials belong in ``wal_options``."""
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    secret = {"access_key", "secret_key", "session_token"} & set(parse_qs(parts.query))
    if "@" in parts.netloc or secret:
        raise ValueError(
            "KafkaSink wal= must not carry credentials (they would show in errors and logs): "
            "pass them in wal_options={'access_key': ..., 'secret_key': ...} or let the "
            "AWS environment chain find them"
        )
