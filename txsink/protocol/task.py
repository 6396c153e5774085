"""The executor side of an epoch: one partition task writes and pre-commits.

Independent of Spark so the protocol can be driven without it in tests: the
pre-commit runs as partition tasks of any :class:`~txsink.contract.EpochData`
(:class:`txsink.spark.jobs.SparkEpochData` in a query), which only feeds it Arrow
batches and the task's partition id and attempt id.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from txsink.audit.digest import Digest, digest_batch
from txsink.contract import EpochData, SinkContract, TaskInfo
from txsink.errors import EpochAbortedError, InjectedFault, RetryableError, TxsinkError
from txsink.handles import Handle, dump_handle, load_handle
from txsink.protocol.faults import CrashPoint, FaultPlan
from txsink.schema import SchemaChange
from txsink.txid import TxnId

__all__ = [
    "Ack",
    "Precommit",
    "TaskPlan",
    "collect_acks",
    "discard_all",
    "precommit_job",
    "run_partition",
]


#: ``TXSINK_ROW_DIGEST=off`` in the executors' environment: no digest (the benchmarks'
#: comparison; decisions then carry no evidence, and a deep audit compares counts only).
DIGEST_ENV = "TXSINK_ROW_DIGEST"


@dataclass(frozen=True)
class TaskPlan:
    """Everything a partition task needs; pickled into the Spark job's closure."""

    app_id: str
    epoch: int
    round: int
    sinks: tuple[SinkContract[Any, Any], ...]
    faults: FaultPlan | None
    driver_pid: int
    driver_host: str | None = None
    #: sink uid -> the schema change this epoch applies (recorded in its decision).
    schema: Mapping[str, SchemaChange] = field(default_factory=dict)
    #: The rows' Arrow schema, as the driver knows it (recorded in the decision).
    rows_schema: pa.Schema | None = None

    def fire(self, point: CrashPoint, partition: int) -> None:
        if self.faults is not None:
            self.faults.fire(
                point,
                epoch=self.epoch,
                partition=partition,
                driver_pid=self.driver_pid,
                driver_host=self.driver_host,
            )


@dataclass(frozen=True)
class Ack:
    """A partition's pre-commit acknowledgement for one sink."""

    sink: str
    partition: int
    attempt: int
    handle: dict[str, Any] | None
    rows: int
    nbytes: int
    error: TxsinkError | None = None


def run_partition(
    plan: TaskPlan,
    partition: int,
    attempt: int,
    batches: Iterable[pa.RecordBatch],
    held: dict[str, Any] | None = None,
) -> list[Ack]:
    """Write ``batches`` to every sink of ``plan`` and prepare; one ack per sink.

    ``held`` (a single-pass task): the prepared transactions of sinks that commit in
    the task are kept there, by sink uid, for the task to commit or discard after the
    driver's answer; on a failure here they are discarded with the others.

    Each handle carries the digest of the rows (:mod:`txsink.audit.digest`) as its
    ``evidence``: every sink is handed the same batches, so one digest serves them all, and
    it is computed here, once, for every connector alike.

    Bad input (a :class:`~txsink.errors.TxsinkError` that is not retryable)
    comes back as an error ack so the driver raises it with its full context
    and no task retry wastes time on it; transient errors and injected faults
    are raised so Spark retries the task attempt.
    """
    open_txns: dict[str, Any] = {}
    rows = 0
    digest: Digest | None = None if os.environ.get(DIGEST_ENV, "on") == "off" else Digest()
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if digest is not None:
                digest += digest_batch(batch)
            for sink in plan.sinks:
                txn = open_txns.get(sink.uid)
                if txn is None:
                    txn_id = TxnId(
                        plan.app_id, sink.uid, plan.epoch, plan.round, partition, attempt
                    )
                    with _hook(sink, "begin"):
                        txn = open_txns[sink.uid] = sink.begin(txn_id, batch.schema)
                with _hook(sink, "write"):
                    sink.write(txn, batch)
            rows += batch.num_rows
        plan.fire(CrashPoint.BEFORE_PRECOMMIT, partition)
        acks = []
        for sink in plan.sinks:
            txn = open_txns.pop(sink.uid, None)
            if txn is None:
                acks.append(Ack(sink.uid, partition, attempt, None, 0, 0))
                continue
            try:
                with _hook(sink, "prepare"):
                    handle = sink.prepare(txn)
            except BaseException:
                open_txns[sink.uid] = txn
                raise
            if held is not None and sink.commits_in_task:
                held[sink.uid] = txn
            if digest is not None:
                handle = dataclasses.replace(handle, evidence=digest.to_json())
            acks.append(
                Ack(sink.uid, partition, attempt, dump_handle(handle), handle.rows, handle.nbytes)
            )
        plan.fire(CrashPoint.AFTER_PRECOMMIT, partition)
        return acks
    except (RetryableError, InjectedFault) as err:
        discard_all(plan, open_txns, held)
        raise err.with_context(partition=partition, epoch=plan.epoch) from None
    except TxsinkError as err:
        discard_all(plan, open_txns, held)
        err.with_context(partition=partition, epoch=plan.epoch, phase="precommit")
        return [Ack(s.uid, partition, attempt, None, 0, 0, err) for s in plan.sinks]
    except BaseException:
        discard_all(plan, open_txns, held)
        raise


@contextlib.contextmanager
def _hook(sink: SinkContract[Any, Any], phase: str) -> Iterator[None]:
    """Around a sink's hook: its txsink errors get the sink's context; any other exception
    (a connector's gap) becomes a RetryableError with that context, so Spark retries the
    task as before, and the failure, if it stays, names the sink and the phase."""
    try:
        yield
    except TxsinkError as err:
        raise err.with_context(sink_uid=sink.uid, connector=sink.connector, phase=phase) from None
    except Exception as err:
        text = str(err).strip().splitlines()
        raise RetryableError(
            f"{phase} failed with {type(err).__name__}: {text[0] if text else ''}. Fix the "
            "cause it names; Spark retries the task",
            sink_uid=sink.uid,
            connector=sink.connector,
            phase=phase,
        ) from err


def discard_all(
    plan: TaskPlan, open_txns: dict[str, Any], held: dict[str, Any] | None = None
) -> None:
    """Discard every open (and held) transaction of a task, best effort."""
    for sink in plan.sinks:
        txn = open_txns.pop(sink.uid, None)
        if txn is None and held is not None:
            txn = held.pop(sink.uid, None)
        if txn is not None:
            # Best effort: recovery aborts whatever this leaves behind.
            with contextlib.suppress(Exception):
                sink.discard(txn)


#: The pre-commit step: runs every partition task of ``plan`` and returns their acks.
Precommit = Callable[[TaskPlan], list[Ack]]


def precommit_job(data: EpochData) -> Precommit:
    """The pre-commit as one job over ``data``'s partitions (alignment is the job's end:
    one result per partition, from the attempt whose result the driver received; other
    attempts' transactions are aborted by the coordinator)."""

    def run(plan: TaskPlan) -> list[Ack]:
        results = data.map_partitions(functools.partial(_precommit_task, plan))
        return [ack for acks in results for ack in acks]

    return run


def _precommit_task(plan: TaskPlan, task: TaskInfo, batches: Iterator[pa.RecordBatch]) -> list[Ack]:
    return run_partition(plan, task.partition, task.attempt, batches)


def collect_acks(
    sinks: Iterable[SinkContract[Any, Any]], epoch: int, acks: Iterable[Ack]
) -> tuple[dict[str, list[Handle]], dict[str, int]]:
    """Check every (sink, partition) acked exactly once; the loaded handles and rows per sink."""
    sinks = list(sinks)
    handles: dict[str, list[Handle]] = {s.uid: [] for s in sinks}
    rows: dict[str, int] = {s.uid: 0 for s in sinks}
    seen: set[tuple[str, int]] = set()
    for ack in acks:
        key = (ack.sink, ack.partition)
        if ack.sink not in handles or key in seen:
            raise EpochAbortedError(
                f"unexpected pre-commit ack {key} (unknown sink or duplicate partition)",
                epoch=epoch,
                sink_uid=ack.sink,
                partition=ack.partition,
            )
        seen.add(key)
        if ack.handle is not None:
            handles[ack.sink].append(load_handle(ack.handle, sink_uid=ack.sink))
            rows[ack.sink] += ack.rows
    partitions = {p for _, p in seen}
    for sink in sinks:
        acked = {p for u, p in seen if u == sink.uid}
        if acked != partitions:
            raise EpochAbortedError(
                f"sink {sink.uid} did not ack partitions {sorted(partitions - acked)}",
                epoch=epoch,
                sink_uid=sink.uid,
            )
    return handles, rows
