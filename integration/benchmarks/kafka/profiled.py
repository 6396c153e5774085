"""KafkaSink with timers around its seams, for the profile runs (their numbers are not in
the throughput table): the seconds of each step, per pre-commit task and per commit.

The sink and its commit tasks are pickled into Spark's tasks: this module is shipped by
value (``_bench.pickle_by_value``) and must not use ``_bench``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast
from unittest import mock

import pyarrow as pa
from typing_extensions import override

from txsink.connectors.kafka import fromreplay as kafka_replay
from txsink.connectors.kafka import wal as kafka_wal
from txsink.connectors.kafka.clients import pool as kafka_pool
from txsink.connectors.kafka.clients.markers import Markers
from txsink.connectors.kafka.clients.producers import ShardProducers, produce_records
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.connectors.kafka.fromreplay import ShardResult
from txsink.connectors.kafka.records.format import RecordFormat
from txsink.connectors.kafka.sink import KafkaHandle, KafkaSink, OpenTxn
from txsink.contract import EpochCommit, EpochData, TaskInfo
from txsink.txid import TxnId

R = TypeVar("R")

#
# The numbers of the profile tables, and where each is taken (the timers wrap whole hooks,
# calls or batches, never single records):
#
#   check, begin, write, prepare   the sink's hooks (ProfiledKafkaSink)
#   total          the WAL driver's commit_epoch, or one replay commit task (ShardCommit)
#   producer       ShardProducers.get: a new producer + init_transactions (~0 when cached)
#   marker         Markers.read: reading the marker topic
#   transaction    ShardProducers.transaction: begin, body, marker record, commit_transaction
#   body           the records of the transaction: reading them (the WAL file, or Spark's
#                  persisted rows + records + checksum) and the produce loop
#   records        RecordFormat.encode in a replay commit task
#   produce        producers.produce_records, per batch: the produce loop
#   delete_wal     WAL mode: a shard's files are deleted between its transaction and
#                  request.committed(), so the time between the two


class Profile:
    """Seconds by step, summed over calls, of one unit: a pre-commit task or a commit."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, key: str, t0: float) -> float:
        """Add the time since ``t0`` (``time.perf_counter()``) to ``key``; returns now."""
        now = time.perf_counter()
        self.seconds[key] = self.seconds.get(key, 0.0) + now - t0
        return now

    def dump(self, profile_dir: str, name: str, record: dict[str, Any]) -> None:
        """Write ``record`` and the seconds to ``<profile_dir>/<name>.json``."""
        write_record(profile_dir, name, {**record, **self.seconds})


def write_record(profile_dir: str, name: str, record: dict[str, Any]) -> None:
    """One profile record, ``<profile_dir>/<name>.json`` (read back by ``profile_run``)."""
    Path(profile_dir, f"{name}.json").write_text(json.dumps(record))


class ProfiledMarkers(Markers):
    """Markers whose reads of the marker topic are timed (``marker``)."""

    def __init__(self, settings: KafkaSettings, profile: Profile) -> None:
        super().__init__(settings)
        self.profile = profile

    @override
    def read(
        self,
        app: str,
        shards: Sequence[int],
        *,
        wait_s: float | None = None,
        phase: str = "commit",
    ) -> dict[int, int]:
        t0 = time.perf_counter()
        found = super().read(app, shards, wait_s=wait_s, phase=phase)
        self.profile.add("marker", t0)
        return found


class ProfiledShardProducers(ShardProducers):
    """ShardProducers with ``producer``, ``marker``, ``transaction`` and ``body`` timed.

    ``ended`` is when the last transaction committed (for WAL mode's ``delete_wal``).
    """

    def __init__(self, settings: KafkaSettings, profile: Profile) -> None:
        super().__init__(settings)
        self.profile = profile
        self.markers = ProfiledMarkers(settings, profile)
        self.ended: float | None = None

    @override
    def get(self, shard: int, phase: str = "commit") -> Any:
        t0 = time.perf_counter()
        producer = super().get(shard, phase)
        self.profile.add("producer", t0)
        return producer

    @override
    def transaction(
        self,
        shard: int,
        app: str,
        epoch: int,
        body: Callable[[Any], None],
        *,
        reused: bool = False,
    ) -> None:
        def timed_body(producer: Any) -> None:
            t1 = time.perf_counter()
            body(producer)
            self.profile.add("body", t1)

        t0 = time.perf_counter()
        super().transaction(shard, app, epoch, timed_body, reused=reused)
        self.ended = self.profile.add("transaction", t0)


@dataclass(frozen=True)
class ProfiledRecordFormat(RecordFormat):
    """RecordFormat with ``encode`` timed (``records``)."""

    profile: Profile = field(default_factory=Profile, compare=False)

    @classmethod
    def of(cls, fmt: RecordFormat, profile: Profile) -> ProfiledRecordFormat:
        options = {f.name: getattr(fmt, f.name) for f in dataclasses.fields(fmt)}
        return cls(**options, profile=profile)

    @override
    def encode(
        self,
        batch: pa.RecordBatch,
        partition: int,
        first_row: int,
        *,
        app: str = "",
        epoch: int = -1,
    ) -> pa.RecordBatch:
        t0 = time.perf_counter()
        records = super().encode(batch, partition, first_row, app=app, epoch=epoch)
        self.profile.add("records", t0)
        return records


@contextlib.contextmanager
def timed_produce(profile: Profile) -> Iterator[None]:
    """While open, the WAL and replay commits' produce loop is timed per batch (``produce``).

    ``produce_records`` is a module function that ``wal`` and ``replay`` import by name, with
    no seam to wrap it by: it is swapped in those two modules, in this process only, for one
    profiled commit.
    """

    def timed(producer: Any, batch: pa.RecordBatch, columns: Any = None) -> None:
        t0 = time.perf_counter()
        produce_records(producer, batch, columns)
        profile.add("produce", t0)

    with (
        mock.patch.object(kafka_wal, "produce_records", timed),
        mock.patch.object(kafka_replay, "produce_records", timed),
    ):
        yield


@dataclass(frozen=True)
class ProfiledCommitTask:
    """Replay mode's commit task (``replay.ShardCommit``, pickled into each task) with its
    steps timed; writes ``commit-shard-<shard>-<epoch>.json``.

    The task takes its producers from the Python worker's pool (``kafka.pool``; librdkafka
    clients do not pickle): the pool makes profiling ones while this runs, and a pooled
    profiling one reports to this task's profile.
    """

    task: kafka_replay.ShardCommit
    profile_dir: str

    def __call__(self, info: TaskInfo, batches: Iterator[pa.RecordBatch]) -> ShardResult:
        prof = Profile()
        task = dataclasses.replace(self.task, fmt=ProfiledRecordFormat.of(self.task.fmt, prof))
        producers = functools.partial(ProfiledShardProducers, profile=prof)
        t0 = time.perf_counter()
        with timed_produce(prof), mock.patch.object(kafka_pool, "ShardProducers", producers):
            pooled = kafka_pool.shard_producers(task.settings)
            if isinstance(pooled, ProfiledShardProducers):  # made by an earlier task
                pooled.profile = prof
                if isinstance(pooled.markers, ProfiledMarkers):
                    pooled.markers.profile = prof
            out = task(info, batches)
        prof.add("total", t0)
        prof.dump(
            self.profile_dir,
            f"commit-shard-{info.partition}-{task.epoch}",
            {"kind": "commit", "where": "task"},
        )
        return out


@dataclass(frozen=True)
class ProfiledData:
    """The epoch's rows (replay mode), running the commit tasks as ProfiledCommitTask."""

    data: EpochData
    profile_dir: str

    def map_partitions(
        self, task: Callable[[TaskInfo, Iterator[pa.RecordBatch]], R], *, barrier: bool = False
    ) -> list[R]:
        if not isinstance(task, kafka_replay.ShardCommit):
            return self.data.map_partitions(task, barrier=barrier)
        results = self.data.map_partitions(ProfiledCommitTask(task, self.profile_dir))
        return cast("list[R]", results)


class ProfiledKafkaSink(KafkaSink):
    """KafkaSink that writes the seconds spent in its steps, per task and per commit.

    Used only for the profile runs (their numbers are not in the throughput table). Each
    pre-commit task writes ``precommit-<txn>.json`` at ``prepare``; each commit (the
    driver's ``commit_epoch`` in WAL mode, each replay commit task) writes ``commit-*.json``.
    """

    def __init__(self, *args: Any, profile_dir: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profile_dir = profile_dir
        self._prof = Profile()  # the pre-commit task's (new at begin)
        self._started = 0.0  # when the pre-commit task's begin was called
        self._commit_prof = Profile()  # the WAL driver's commit (reset by commit_epoch)
        # The driver's producers (KafkaSink makes them lazily, with no seam to pass others):
        # profiled from the start, as check() initialises them and WAL commits reuse them.
        self._clients = ProfiledShardProducers(self.settings, self._commit_prof)

    # the driver's start-up checks (init_transactions per shard, marker topic, ...)

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        t0 = time.perf_counter()
        super().check(schema, app_id)
        write_record(
            self.profile_dir, "check-driver", {"kind": "check", "seconds": time.perf_counter() - t0}
        )

    # pre-commit tasks

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> OpenTxn:
        t0 = time.perf_counter()
        opened = super().begin(txn, schema)
        self._prof, self._started = Profile(), t0
        self._prof.add("begin", t0)
        return opened

    @override
    def write(self, txn: OpenTxn, batch: pa.RecordBatch) -> None:
        t0 = time.perf_counter()
        super().write(txn, batch)
        self._prof.add("write", t0)

    @override
    def prepare(self, txn: OpenTxn) -> KafkaHandle:
        t0 = time.perf_counter()
        handle = super().prepare(txn)
        end = time.perf_counter()
        p = self._prof.seconds
        write_record(
            self.profile_dir,
            f"precommit-{txn.txn}",
            {
                "kind": "precommit",
                "partition": txn.txn.partition,
                "rows": handle.rows,
                "begin": p.get("begin", 0.0),
                "write": p.get("write", 0.0),
                "prepare": end - t0,
                "span": end - (self._started or t0),
            },
        )
        return handle

    # commit: the driver (WAL) or one task per shard (replay)

    @override
    def commit_epoch(self, request: EpochCommit[Any]) -> None:
        if self.mode == "replay":
            if request.data is not None:
                request = dataclasses.replace(
                    request, data=ProfiledData(request.data, self.profile_dir)
                )
            super().commit_epoch(request)
            return
        # WAL mode commits in one Spark task per shard (the same ShardCommit path as replay
        # without the rows): only the phase's total is measured here, on the driver.
        prof = self._commit_prof
        prof.seconds.clear()
        t0 = time.perf_counter()
        super().commit_epoch(request)
        prof.add("total", t0)
        prof.dump(
            self.profile_dir, f"commit-wal-{request.epoch}", {"kind": "commit", "where": "tasks"}
        )
