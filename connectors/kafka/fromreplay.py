"""Commit decided shards from Spark's replay of the epoch, verified by count and checksum.

What replay mode's commit and direct mode's leftovers share (a mode never imports
another, so the piece both use lives here)::

    shards   each decided shard has a count and a checksum of its records, recorded at
             pre-commit (:class:`~txsink.connectors.kafka.records.checksum.Tally`)
    commit   a job over the epoch's replayed rows through EpochData.map_partitions, one
             task per partition (:class:`ShardCommit`): encode, checksum, produce, and the
             shard's marker in one transaction, committed only if count and checksum match
             the decided ones (the worker's pooled producer,
             :func:`~txsink.connectors.kafka.clients.pool.commit_shard`); else the
             transaction is aborted and the partition's rows are only counted
    match    a shard left uncommitted is committed from the replayed partition with its
             count and checksum (a replay that numbers the partitions otherwise), or, if
             none has them, NonDeterministicReplayError, nothing of that shard written

After a crash only the replay of the same epoch (Spark re-running the batch) can commit
it: the rows exist nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import pyarrow as pa

from txsink.connectors.kafka.clients import pool
from txsink.connectors.kafka.clients.columns import py_columns
from txsink.connectors.kafka.clients.producers import produce_records
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.connectors.kafka.records.checksum import CHECKSUM_VERSION, Tally
from txsink.connectors.kafka.records.format import RecordFormat
from txsink.contract import EpochData, TaskInfo
from txsink.errors import NonDeterministicReplayError
from txsink.observe.logs import get_logger

__all__ = ["Decided", "ShardCommit", "ShardResult", "commit_by_content"]


#: A shard's decided (rows, checksum, checksum version).
Decided: TypeAlias = tuple[int, int, int]


@dataclass(frozen=True)
class ShardResult:
    """What one replay task did with its partition: committed it as ``shard``, found
    ``shard`` committed already, or only counted it (``tallied``: its number names no
    shard left to commit, or its rows are not that shard's) -- with the rows' count and
    checksum, for the match by content."""

    partition: int
    shard: int | None
    status: Literal["committed", "already-committed", "tallied", "skipped"]
    rows: int = 0
    checksum: int = 0


def commit_by_content(
    data: EpochData,
    settings: KafkaSettings,
    fmt: RecordFormat,
    *,
    app: str,
    epoch: int,
    decided: dict[int, Decided],
) -> list[ShardResult]:
    """Commit every decided shard from the epoch's replay, each from the replayed
    partition that holds its rows: the same count and checksum.

    Usually partition ``p`` of the replay holds shard ``p``'s rows, and one job commits
    them all. A restart may number the same partitions otherwise (a source that lists
    its partitions in another order): the tasks whose rows are not their number's shard
    only count them (their transaction aborted), and a second job commits each shard
    left from the partition whose count and checksum are its decided ones. A shard that
    no partition matches is a replay that differs in content: NonDeterministicReplayError,
    nothing of that shard written (the plans that cause it are refused at the start,
    :mod:`txsink.spark.stability`).
    """
    first = data.map_partitions(ShardCommit(settings, fmt, app, epoch, decided))
    done = {r.shard for r in first if r.status in ("committed", "already-committed")}
    left = sorted(set(decided) - done)
    if not left:
        return first
    free = [r for r in first if r.status != "committed"]
    assignment: dict[int, int] = {}
    for shard in left:
        rows, sum_, _ = decided[shard]
        match = next(
            (r for r in free if (r.rows, r.checksum) == (rows, sum_)),
            None,
        )
        if match is None:
            raise _differs(settings, epoch, shard, decided[shard], free)
        free.remove(match)
        assignment[match.partition] = shard
    get_logger(__name__, uid=settings.uid, epoch=epoch).info(
        "the replay numbers the epoch's partitions otherwise: committing shard(s) %s from "
        "partition(s) %s, matched by count and checksum",
        list(assignment.values()),
        list(assignment),
    )
    second = data.map_partitions(
        ShardCommit(settings, fmt, app, epoch, decided, assignment=assignment)
    )
    return first + [r for r in second if r.status != "skipped"]


def _differs(
    settings: KafkaSettings,
    epoch: int,
    shard: int,
    decided: Decided,
    free: list[ShardResult],
) -> NonDeterministicReplayError:
    rows, sum_, _ = decided
    seen = ", ".join(f"partition {r.partition}: {r.rows} ({r.checksum})" for r in free[:8])
    return NonDeterministicReplayError(
        f"the replay of epoch {epoch} has no partition with shard {shard}'s rows: its "
        f"pre-commit recorded {rows} records (checksum {sum_}), the replay's partitions not "
        f"committed yet hold {seen or 'nothing'}. The source or a transformation is not "
        "deterministic (or the query's code changed since the crash). Nothing of that "
        "shard was written. Restore the query as it was when the epoch was decided until "
        "the epoch is committed, and use mode='wal' for a query whose input is not "
        "replayed the same (the WAL keeps the decided records)",
        sink_uid=settings.uid,
        epoch=epoch,
        partition=shard,
        connector="kafka",
        phase="commit",
    )


@dataclass(frozen=True)
class ShardCommit:
    """The replay commit task (pickled into each task). Partition ``p`` commits as shard
    ``p`` if its rows are that shard's, else only counts them; with ``assignment``
    (partition -> shard: the match by content), the partitions it names commit as their
    shard, the others do nothing."""

    settings: KafkaSettings
    fmt: RecordFormat
    app: str
    epoch: int
    #: shard -> (rows, checksum, checksum version) decided at pre-commit
    decided: dict[int, Decided]
    assignment: dict[int, int] | None = None

    def __call__(self, task: TaskInfo, batches: Iterator[pa.RecordBatch]) -> ShardResult:
        """Commit the task's shard with the worker's pooled producer
        (:func:`~txsink.connectors.kafka.clients.pool.commit_shard`): each batch encoded, converted
        to Python objects once for the checksum and the produce loop."""
        partition = task.partition
        if self.assignment is not None:
            shard: int | None = self.assignment.get(partition)
            if shard is None:
                return ShardResult(partition, None, "skipped")
        else:
            shard = partition if partition in self.decided else None
        version = next(iter(self.decided.values()), (0, 0, CHECKSUM_VERSION))[2]
        if shard is None:  # no shard left under this number: its rows, for the match
            tally = Tally(version)
            for batch in batches:
                tally.add(
                    self.fmt.encode(batch, partition, tally.rows, app=self.app, epoch=self.epoch)
                )
            return ShardResult(partition, None, "tallied", tally.rows, tally.checksum)
        rows, sum_, version = self.decided[shard]
        tally = Tally(version)

        def produce(producer: Any, batch: pa.RecordBatch) -> int:
            records = self.fmt.encode(batch, shard, tally.rows, app=self.app, epoch=self.epoch)
            columns = py_columns(records)
            tally.add(records, columns)
            produce_records(producer, records, columns)
            return int(records.num_rows)

        def verify() -> None:
            if (tally.rows, tally.checksum) != (rows, sum_):
                raise NonDeterministicReplayError(
                    f"the replay of epoch {self.epoch} gives shard {shard} {tally.rows} records "
                    f"(checksum {tally.checksum}), but its pre-commit recorded {rows} (checksum "
                    f"{sum_}): the source or a transformation is not deterministic. Nothing "
                    "was written. Use mode='wal' for this query (the WAL keeps the decided "
                    "records), or make the input deterministic",
                    sink_uid=self.settings.uid,
                    epoch=self.epoch,
                    partition=shard,
                    connector="kafka",
                    phase="commit",
                )

        taken = _Taken(batches)
        try:
            done = pool.commit_shard(
                self.settings,
                shard,
                self.app,
                self.epoch,
                items=taken,
                produce=produce,
                start=tally.reset,
                finish=verify,
            )
        except NonDeterministicReplayError:
            if self.assignment is not None:
                raise  # matched by content in the first job, other rows now
            # Not this number's shard (its transaction is aborted): its rows, for the match.
            return ShardResult(partition, None, "tallied", tally.rows, tally.checksum)
        if done:
            return ShardResult(partition, shard, "committed", tally.rows, tally.checksum)
        if self.assignment is None:
            # The marker says shard ``shard`` is committed; this partition's rows may be
            # another shard's (a replay numbered otherwise): counted, for the match.
            tally = Tally(version)
            for batch in taken.rest():
                tally.add(
                    self.fmt.encode(batch, partition, tally.rows, app=self.app, epoch=self.epoch)
                )
        return ShardResult(partition, shard, "already-committed", tally.rows, tally.checksum)


class _Taken:
    """The task's batches, and those not taken by a commit that stopped early."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._it = iter(batches)
        self.any = False

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for batch in self._it:
            self.any = True
            yield batch

    def rest(self) -> Iterator[pa.RecordBatch]:
        if self.any:  # pragma: no cover - the marker read comes before any item
            raise RuntimeError("the replay's rows were partly taken before the marker read")
        return self._it
