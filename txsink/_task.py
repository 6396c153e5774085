"""The executor side of an epoch: one partition task writes and pre-commits.

Independent of Spark so the protocol can be driven without it in tests; the
Spark adapter in :mod:`txsink._spark` only feeds it Arrow batches and the
task's partition id and attempt id.
"""

from __future__ import annotations

import contextlib
import json
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from txsink.errors import InjectedFault, RetryableError, TxsinkError
from txsink.faults import CrashPoint, FaultPlan
from txsink.handles import dump_handle
from txsink.sink import TwoPhaseCommitSink
from txsink.txid import TxnId

__all__ = [
    "ACK_SCHEMA",
    "ACK_SCHEMA_DDL",
    "Ack",
    "TaskPlan",
    "acks_from_batch",
    "acks_to_batch",
    "run_partition",
]

ACK_SCHEMA = pa.schema(
    [
        ("sink", pa.string()),
        ("partition", pa.int64()),
        ("attempt", pa.int64()),
        ("handle", pa.string()),
        ("rows", pa.int64()),
        ("nbytes", pa.int64()),
        ("error", pa.binary()),
    ]
)
ACK_SCHEMA_DDL = (
    "sink string, partition long, attempt long, handle string, rows long, nbytes long, error binary"
)


@dataclass(frozen=True)
class TaskPlan:
    """Everything a partition task needs; pickled into the Spark job's closure."""

    app_id: str
    epoch: int
    round: int
    sinks: tuple[TwoPhaseCommitSink[Any, Any], ...]
    faults: FaultPlan | None
    driver_pid: int
    driver_host: str | None = None

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
    plan: TaskPlan, partition: int, attempt: int, batches: Iterable[pa.RecordBatch]
) -> list[Ack]:
    """Write ``batches`` to every sink of ``plan`` and prepare; one ack per sink.

    Bad input (a :class:`~txsink.errors.TxsinkError` that is not retryable)
    comes back as an error ack so the driver raises it with its full context
    and no task retry wastes time on it; transient errors and injected faults
    are raised so Spark retries the task attempt.
    """
    open_txns: dict[str, Any] = {}
    rows = 0
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            for sink in plan.sinks:
                txn = open_txns.get(sink.uid)
                if txn is None:
                    txn_id = TxnId(
                        plan.app_id, sink.uid, plan.epoch, plan.round, partition, attempt
                    )
                    txn = open_txns[sink.uid] = sink.begin(txn_id, batch.schema)
                try:
                    sink.write(txn, batch)
                except TxsinkError as err:
                    raise err.with_context(
                        sink_uid=sink.uid, connector=sink.connector, phase="write"
                    ) from None
            rows += batch.num_rows
        plan.fire(CrashPoint.BEFORE_PRECOMMIT, partition)
        acks = []
        for sink in plan.sinks:
            txn = open_txns.pop(sink.uid, None)
            if txn is None:
                acks.append(Ack(sink.uid, partition, attempt, None, 0, 0))
                continue
            try:
                handle = sink.prepare(txn)
            except TxsinkError as err:
                open_txns[sink.uid] = txn
                raise err.with_context(
                    sink_uid=sink.uid, connector=sink.connector, phase="prepare"
                ) from None
            except BaseException:
                open_txns[sink.uid] = txn
                raise
            acks.append(
                Ack(sink.uid, partition, attempt, dump_handle(handle), handle.rows, handle.nbytes)
            )
        plan.fire(CrashPoint.AFTER_PRECOMMIT, partition)
        return acks
    except (RetryableError, InjectedFault) as err:
        _discard_all(plan, open_txns)
        raise err.with_context(partition=partition, epoch=plan.epoch) from None
    except TxsinkError as err:
        _discard_all(plan, open_txns)
        err.with_context(partition=partition, epoch=plan.epoch, phase="precommit")
        return [Ack(s.uid, partition, attempt, None, 0, 0, err) for s in plan.sinks]
    except BaseException:
        _discard_all(plan, open_txns)
        raise


def _discard_all(plan: TaskPlan, open_txns: dict[str, Any]) -> None:
    for sink in plan.sinks:
        txn = open_txns.pop(sink.uid, None)
        if txn is not None:
            # Best effort: recovery aborts whatever this leaves behind.
            with contextlib.suppress(Exception):
                sink.discard(txn)


def acks_to_batch(acks: list[Ack]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "sink": [a.sink for a in acks],
            "partition": [a.partition for a in acks],
            "attempt": [a.attempt for a in acks],
            "handle": [None if a.handle is None else json.dumps(a.handle) for a in acks],
            "rows": [a.rows for a in acks],
            "nbytes": [a.nbytes for a in acks],
            "error": [None if a.error is None else pickle.dumps(a.error) for a in acks],
        },
        schema=ACK_SCHEMA,
    )


def acks_from_batch(rows: Iterable[dict[str, Any]]) -> list[Ack]:
    """Rebuild acks from collected rows (dicts with the :data:`ACK_SCHEMA` fields)."""
    out = []
    for r in rows:
        # Our own task pickled this error in this application: trusted input.
        error = None if r["error"] is None else pickle.loads(r["error"])  # noqa: S301
        handle = None if r["handle"] is None else json.loads(r["handle"])
        out.append(
            Ack(
                r["sink"],
                int(r["partition"]),
                int(r["attempt"]),
                handle,
                int(r["rows"]),
                int(r["nbytes"]),
                error,
            )
        )
    return out
