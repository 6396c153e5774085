"""In-memory participants for unit tests of the coordinator's logic (no Spark, no servers).

``Crasher`` models a process death at step k: the k-th tick raises ``Crash``
and so does every tick after it, so no handler can still change anything.
That is what SIGKILL does, and what makes the exhaustive test honest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
from typing_extensions import override

from txsink.errors import CommitError
from txsink.handles import Handle, register_handle
from txsink.protocol.task import Ack, TaskPlan, run_partition
from txsink.sink import TwoPhaseCommitSink
from txsink.txid import TxnId


class Crash(BaseException):
    """The simulated process died here."""


@dataclass
class Crasher:
    """Counts steps; dies at step ``at`` (0 = never)."""

    at: int = 0
    steps: int = 0
    dead: bool = False
    trace: list[str] = field(default_factory=list)

    def tick(self, label: str) -> None:
        if self.dead:
            raise Crash(f"already dead ({label})")
        self.steps += 1
        self.trace.append(label)
        if self.at and self.steps == self.at:
            self.dead = True
            raise Crash(label)


class MemStore:
    """A LogStore in a dict; create-if-absent is trivially atomic here."""

    location = "memory://log"

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.crasher = Crasher()

    def create(self, key: str, data: bytes) -> bool:
        self.crasher.tick(f"log.create {key} (before)")
        if key in self.data:
            return False
        self.data[key] = data
        self.crasher.tick(f"log.create {key} (after)")
        return True

    def read(self, key: str) -> bytes | None:
        return self.data.get(key)

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in self.data if k.startswith(prefix))

    def delete(self, key: str) -> None:
        self.crasher.tick(f"log.delete {key}")
        self.data.pop(key, None)


@dataclass
class MemTarget:
    """The target system: prepared transactions and committed (visible) rows."""

    prepared: dict[str, list[int]] = field(default_factory=dict)
    committed: dict[str, list[int]] = field(default_factory=dict)
    manifests: set[int] = field(default_factory=set)

    def visible(self) -> list[int]:
        return [r for rows in self.committed.values() for r in rows]


@register_handle
@dataclass(frozen=True)
class MemHandle(Handle):
    serializer: ClassVar[str] = "tests.memory"
    version: ClassVar[int] = 1


@dataclass
class _Open:
    txn: TxnId
    rows: list[int] = field(default_factory=list)


class MemSink(TwoPhaseCommitSink[_Open, MemHandle]):
    connector: ClassVar[str] = "memory"
    handle_type: ClassVar[type[Handle]] = MemHandle

    def __init__(self, uid: str, target: MemTarget, crasher: Crasher) -> None:
        super().__init__(uid)
        self.target = target
        self.crasher = crasher

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> _Open:
        return _Open(txn)

    @override
    def write(self, txn: _Open, batch: pa.RecordBatch) -> None:
        txn.rows.extend(batch.column("id").to_pylist())

    @override
    def prepare(self, txn: _Open) -> MemHandle:
        self.crasher.tick(f"{self.uid} prepare {txn.txn}")
        self.target.prepared[str(txn.txn)] = list(txn.rows)
        return MemHandle(txn=txn.txn, rows=len(txn.rows))

    @override
    def commit(self, handle: MemHandle) -> None:
        name = str(handle.txn)
        self.crasher.tick(f"{self.uid} commit {name} (before)")
        if name in self.target.prepared and handle.rows != len(self.target.prepared[name]):
            # Like files: a stand-in handle from list_prepared cannot be committed.
            raise CommitError(
                f"{name}: handle says {handle.rows} rows, prepared holds "
                f"{len(self.target.prepared[name])}",
                sink_uid=self.uid,
            )
        if name in self.target.prepared:
            self.target.committed[name] = self.target.prepared.pop(name)
            self.crasher.tick(f"{self.uid} commit {name} (after)")
        elif name not in self.target.committed:
            raise CommitError(f"{name} is neither prepared nor committed", sink_uid=self.uid)

    @override
    def finish_epoch(self, epoch: int, handles: Any) -> None:
        self.target.manifests.add(epoch)

    @override
    def abort(self, handle: MemHandle) -> None:
        self.crasher.tick(f"{self.uid} abort {handle.txn}")
        self.target.prepared.pop(str(handle.txn), None)

    @override
    def list_prepared(self, app_id: str) -> Iterator[MemHandle]:
        for name in sorted(self.target.prepared):
            txn = TxnId.parse(name)
            if txn.belongs_to(app_id, self.uid):
                yield MemHandle(txn=txn)


def batches_for(epoch: int, partitions: int, rows_per_partition: int) -> list[list[pa.RecordBatch]]:
    """Deterministic rows: epoch e, partition p holds ids e*1000 + p*100 + i."""
    out = []
    for p in range(partitions):
        ids = [epoch * 1000 + p * 100 + i for i in range(rows_per_partition)]
        out.append([pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64())})])
    return out


def memory_precommit(
    batches: list[list[pa.RecordBatch]], attempt_base: int = 0
) -> Callable[[TaskPlan], list[Ack]]:
    """A pre-commit that runs every partition task in this process."""

    def run(plan: TaskPlan) -> list[Ack]:
        acks: list[Ack] = []
        for p, bs in enumerate(batches):
            acks.extend(run_partition(plan, p, attempt_base + p, bs))
        return acks

    return run
