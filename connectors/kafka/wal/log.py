"""The write-ahead log of one sink: its check, its files, and their commit per shard.

The driver side of WAL mode: the check at start, the open file of a task
(:mod:`~txsink.connectors.kafka.wal.task`), the files recovery finds and deletes, and
the commit of a decided epoch, one Kafka transaction per shard with the shard's marker.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from txsink.connectors.kafka.clients.errors import client_calls
from txsink.connectors.kafka.clients.producers import ShardProducers, produce_records
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.connectors.kafka.wal.store import WalStore, crc32_of
from txsink.connectors.kafka.wal.task import FILE, KafkaWalHandle, OpenWal
from txsink.contract import EpochCommit, local_tasks
from txsink.errors import CommitError, ConfigurationError, RetryableError
from txsink.handles import Handle
from txsink.observe.logs import get_logger
from txsink.txid import TxnId

__all__ = ["ShardCommit", "ShardResult", "WriteAheadLog", "commit_shard"]


@dataclass(frozen=True)
class ShardResult:
    """What one shard's commit did, and where: ``outcome`` is ``"committed"``,
    ``"already-committed"`` (its marker said so) or ``"committed-elsewhere"`` (its files
    are gone and a re-read marker says another driver committed it)."""

    shard: int
    outcome: str
    records: int = 0
    pid: int = field(default_factory=os.getpid)


@dataclass(frozen=True)
class WriteAheadLog:
    """The write-ahead log of one sink, in ``store``."""

    store: WalStore

    def check(self, ctx: dict[str, Any]) -> None:
        """At start: the location is reachable and writable (a probe file written, read
        back and deleted), else a ConfigurationError that says what to fix."""
        store = self.store
        try:
            store.check_writable()
        except (OSError, ValueError) as err:
            if store.is_local:
                fix = (
                    "create the folder, or make it writable by the user the driver and the "
                    "executors run as; it must be a folder they all share"
                )
            else:
                fix = (
                    "check that the location exists (the bucket), that wal_options "
                    "(endpoint_override, scheme, region, credentials) or wal_filesystem reach it, "
                    "and that the credentials may write, read, list and delete under it "
                    "(S3: PutObject, GetObject, ListBucket, DeleteObject)"
                )
            raise ConfigurationError(
                f"cannot write to the WAL location {store.url} ({store.kind}): "
                f"{_reason(err)}. Fix: {fix}",
                **ctx,
            ) from err

    def open(self, txn: TxnId) -> OpenWal:
        return OpenWal(txn, self.store.writer(f"{txn}/{FILE}"))

    def delete(self, handles: Sequence[Handle]) -> None:
        for h in handles:
            self.store.delete_dir(str(h.txn))

    def list_prepared(self, app_id: str, uid: str) -> Iterator[KafkaWalHandle]:
        for name in self.store.list_dirs():
            txn = TxnId.try_parse(name)
            if txn is not None and txn.belongs_to(app_id, uid):
                yield KafkaWalHandle(txn=txn, path=f"{name}/{FILE}")

    # -- commit ----------------------------------------------------------------------

    def commit_epoch(
        self,
        request: EpochCommit[Any],
        settings: KafkaSettings,
        driver_producers: Callable[[], ShardProducers],
    ) -> list[ShardResult]:
        """One Kafka transaction per shard (its records and marker), one task per shard.

        With cluster tasks (``request.tasks``) every shard commits in its own task, in
        parallel, and the shards are reported to ``request.committed`` once every task
        returned: a crash point there (``during_commit``) cannot fire between the shards
        of parallel tasks. With :data:`~txsink.contract.local_tasks` (no cluster: ``txsink
        recover``) the driver commits shard after shard with ``driver_producers()`` and
        reports each one after its transaction committed.
        """
        handles: Sequence[KafkaWalHandle] = request.handles
        if not handles:
            return []
        by_shard: dict[int, list[KafkaWalHandle]] = defaultdict(list)
        for h in handles:
            by_shard[h.txn.partition % settings.shards].append(h)
        items = [(s, tuple(sorted(by_shard[s], key=lambda h: h.txn))) for s in sorted(by_shard)]
        app = handles[0].txn.app
        if request.tasks is local_tasks:
            return self._commit_here(request, driver_producers(), app, items)
        results = request.tasks.run(ShardCommit(settings, self.store, app, request.epoch), items)
        get_logger(__name__, uid=settings.uid, epoch=request.epoch).debug(
            "Kafka WAL commit: %s",
            ", ".join(
                f"shard {r.shard} {r.outcome} ({r.records} records, process {r.pid})"
                for r in results
            ),
        )
        for _, mine in items:
            request.committed(mine)
        return results

    def _commit_here(
        self,
        request: EpochCommit[Any],
        producers: ShardProducers,
        app: str,
        items: list[tuple[int, tuple[KafkaWalHandle, ...]]],
    ) -> list[ShardResult]:
        for shard, _ in items:
            producers.get(shard)  # init_transactions before reading markers: fences zombies
        producers.markers.load(app, [shard for shard, _ in items])
        results = []
        for shard, mine in items:
            results.append(commit_shard(producers, self.store, shard, request.epoch, mine))
            request.committed(mine)
        return results


@dataclass(frozen=True)
class ShardCommit:
    """The commit of one shard in a task of its own (pickled into it): its own producer,
    fenced with ``init_transactions`` on the shard's transactional id."""

    settings: KafkaSettings
    store: WalStore
    app: str
    epoch: int

    def __call__(self, item: tuple[int, tuple[KafkaWalHandle, ...]]) -> ShardResult:
        shard, handles = item
        producers = ShardProducers(self.settings)
        # Its errors name the shard and epoch, a raw client error classified by code.
        doing = f"committing epoch {self.epoch} from the WAL"
        try:
            with client_calls(self.settings, doing, phase="commit", epoch=self.epoch, shard=shard):
                return commit_shard(producers, self.store, shard, self.epoch, handles)
        finally:
            producers.close()


def commit_shard(
    producers: ShardProducers,
    store: WalStore,
    shard: int,
    epoch: int,
    handles: Sequence[KafkaWalHandle],
) -> ShardResult:
    """Commit one shard's WAL files of ``epoch`` in one Kafka transaction with its marker
    (or verify, by the marker, that it was), then delete them."""
    app, uid = handles[0].txn.app, producers.settings.uid
    wal = WriteAheadLog(store)
    producers.get(shard)  # fences any older producer of the shard
    marker = producers.markers.last(app, shard)
    if marker is not None and marker >= epoch:
        wal.delete(handles)  # committed before a crash: verified by the marker
        return ShardResult(shard, "already-committed")
    missing = [h.path for h in handles if not _exists(store, h, uid, epoch)]
    if missing:
        # The cached marker may be stale: another driver (this one's successor, if this
        # driver was frozen and is a zombie now) may have committed the epoch and deleted
        # its WAL files since. Read the marker again before calling them lost.
        marker = producers.markers.reread(app, shard)
        if marker is not None and marker >= epoch:
            get_logger(__name__, uid=uid, epoch=epoch).info(
                "Kafka shard %s: epoch already committed by another driver (marker: "
                "epoch %s); nothing to do",
                shard,
                marker,
            )
            return ShardResult(shard, "committed-elsewhere")
        raise CommitError(
            f"cannot commit epoch {epoch} shard {shard}: WAL files {missing} are gone from "
            f"{store.url} and the shard's marker says epoch {marker}, so their records are "
            "lost. Was the WAL location cleaned by hand (or by a lifecycle rule that expires "
            "objects)?",
            sink_uid=uid,
            epoch=epoch,
            connector="kafka",
            phase="commit",
        )
    produced = 0

    def body(producer: Any) -> None:
        nonlocal produced
        for h in handles:
            reader = pa.ipc.open_file(_verified(store, h, uid, epoch))
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                produce_records(producer, batch)
                produced += batch.num_rows

    producers.transaction(shard, app, epoch, body)
    wal.delete(handles)
    return ShardResult(shard, "committed", produced)


def _exists(store: WalStore, h: KafkaWalHandle, uid: str, epoch: int) -> bool:
    try:
        return store.exists(h.path)
    except OSError as err:
        raise _unreadable(store, h, uid, epoch, err) from err


def _verified(store: WalStore, h: KafkaWalHandle, uid: str, epoch: int) -> pa.Buffer:
    """The WAL file's bytes, refused if they differ from what the pre-commit wrote.

    A torn or corrupted file could otherwise commit fewer or other records than were
    decided; the CRC was taken of the bytes as they were written, before the decision.
    """
    try:
        data = store.read(h.path)
    except OSError as err:
        raise _unreadable(store, h, uid, epoch, err) from err
    if h.crc32:  # 0: a listed (not decided) handle, never committed
        crc = crc32_of(data)
        if crc != h.crc32:
            raise CommitError(
                f"WAL file {store.path(h.path)} is corrupted or torn ({data.size} bytes, crc32 "
                f"{crc:#010x}; the pre-commit recorded {h.crc32:#010x}): its records cannot be "
                "committed as decided. Restore the file from a backup of the WAL location if "
                "you have one; otherwise the epoch's records of this task are lost",
                sink_uid=uid,
                epoch=epoch,
                partition=h.txn.partition,
                connector="kafka",
                phase="commit",
            )
    return data


def _unreadable(
    store: WalStore, h: KafkaWalHandle, uid: str, epoch: int, err: OSError
) -> RetryableError:
    return RetryableError(
        f"cannot read WAL file {store.path(h.path)}: {_reason(err)}. The decision stands; "
        "the commit is retried: the shard's marker then says whether another driver "
        "committed it meanwhile (check that the WAL location is reachable from the executors)",
        sink_uid=uid,
        epoch=epoch,
        partition=h.txn.partition,
        connector="kafka",
        phase="commit",
    )


def _reason(err: BaseException) -> str:
    """An OS or ``pyarrow.fs`` error in one line (no options: it never carries them)."""
    text = getattr(err, "strerror", None) or str(err) or type(err).__name__
    return " ".join(str(text).split())
