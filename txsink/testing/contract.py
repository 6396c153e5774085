"""The sink contract, checked against a connector's real target, without Spark.

Every check drives the hooks the way the coordinator does (``check``, ``begin``,
``write``, ``prepare``, ``commit_epoch``, ``abort``, ``list_prepared``), and reads the
target back through the connector's testing adapter: its verifier reads what a
downstream reader sees and counts what is still prepared with the target's own means,
never with the sink's. A connector that passes them keeps the promises of
:mod:`txsink.contract`:

* ``nothing_visible_before_commit``: prepared is durable and invisible; commit makes it
  visible once, and leaves nothing prepared;
* ``commit_is_idempotent``: committing a decided epoch again (a recovery after a crash
  in the middle of the commit, on a new driver) changes nothing;
* ``abort_is_idempotent``: aborting twice is fine, and leaves nothing;
* ``already_committed_is_verified``: committing an aborted transaction raises
  :class:`~txsink.errors.CommitError` (its rows are lost): "already committed" is
  checked in the target, never assumed;
* ``crashed_attempt_is_listed``: a task process that dies right after its pre-commit
  (or in the middle of writing) leaves nothing that ``list_prepared`` + ``abort``
  cannot clean;
* ``fresh_process_commits_from_the_handle``: a new process, given the sink (pickled, as
  Spark ships it) and the handles (JSON, as the log keeps them), commits them;
* ``empty_epoch_commits``: an epoch without rows for the sink commits to nothing;
* ``recorded_epoch_is_reported``: a sink that implements ``recorded_epoch`` (it skips an
  epoch its target already records) reports the epoch it committed, for its own app only.

Use it for your own connector (``ADAPTER`` is its
:class:`~txsink.testing.adapter.ConnectorTesting`)::

    import pytest
    from txsink.testing import contract

    @pytest.mark.parametrize("check", contract.CHECKS, ids=contract.CHECK_NAMES)
    def test_contract(check, tmp_path):
        check(contract.ContractRun(ADAPTER, tmp_path))

txsink runs it for every registered connector in ``integration/test_contract.py``.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from txsink.contract import EpochCommit, SinkContract, TaskInfo
from txsink.errors import CommitError
from txsink.handles import Handle, dump_handle, load_handle
from txsink.testing.adapter import ConnectorTesting
from txsink.testing.verifiers import count_ids
from txsink.txid import TxnId

__all__ = [
    "CHECKS",
    "CHECK_NAMES",
    "SCHEMA",
    "ContractRun",
    "ListEpochData",
    "assert_exactly_once",
    "commit",
    "rows",
]

R = TypeVar("R")
AnySink = SinkContract[Any, Any]

#: The Arrow schema of the rows the checks write (the test input's columns).
SCHEMA = pa.schema(
    [("id", pa.int64()), ("key", pa.string()), ("amount", pa.float64()), ("payload", pa.string())]
)


def rows(ids: Sequence[int]) -> pa.RecordBatch:
    """A batch of the test input's rows for ``ids``."""
    return pa.RecordBatch.from_pydict(
        {
            "id": list(ids),
            "key": [f"k{n % 97}" for n in ids],
            "amount": [n / 100 for n in ids],
            "payload": [f"event-{n:09d}" for n in ids],
        },
        schema=SCHEMA,
    )


def _expect(condition: object, message: str) -> None:
    # Not ``assert``: the checks must hold under ``python -O`` too.
    if not condition:
        raise AssertionError(message)


def assert_exactly_once(
    expected: Iterable[int], seen: Iterable[int], *, lingering: int = 0, what: str = ""
) -> None:
    """Every expected id seen exactly once, nothing else, nothing left prepared."""
    verdict = count_ids(expected, seen, lingering=lingering)
    if not verdict.ok:
        raise AssertionError(f"{what + ': ' if what else ''}not exactly once: {verdict}")


class ListEpochData:
    """An epoch's rows as lists of batches per partition, for sinks that commit from data:
    the in-process stand-in for the core's Spark job (:class:`~txsink.contract.EpochData`)."""

    def __init__(self, partitions: Sequence[Sequence[pa.RecordBatch]]) -> None:
        self.partitions = [list(p) for p in partitions]

    def map_partitions(
        self, task: Callable[[TaskInfo, Iterator[pa.RecordBatch]], R], *, barrier: bool = False
    ) -> list[R]:
        n = len(self.partitions)
        return [
            task(TaskInfo(p, 1000 + p, n if barrier else None), iter(b))
            for p, b in enumerate(self.partitions)
        ]


@dataclass
class ContractRun:
    """One connector variant against its real target: fresh targets, hooks, read-back.

    ``env`` locates the server (default ``os.environ``); ``options`` is one of the
    adapter's variants (or a test's own options for ``new_target``).
    """

    adapter: ConnectorTesting
    workdir: Path
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    options: Mapping[str, Any] = field(default_factory=dict)
    app_id: str = field(default_factory=lambda: f"contract-{uuid.uuid4().hex[:8]}")
    _made: list[dict[str, Any]] = field(default_factory=list)

    def target(self) -> tuple[dict[str, Any], AnySink]:
        """A fresh target's spec and its sink, checked as the coordinator does at start."""
        spec = self.adapter.new_target(
            Path(self.workdir), f"c{uuid.uuid4().hex[:10]}", self.env, **dict(self.options)
        )
        self._made.append(spec)
        sink = self.adapter.build_sink(spec, self.env)
        sink.check(SCHEMA, self.app_id)
        return spec, sink

    def prepare(
        self, sink: AnySink, epoch: int, partitions: Sequence[Sequence[int]], *, round_: int = 0
    ) -> list[Handle]:
        """Every partition task of an epoch: begin, write its ids, prepare."""
        handles = []
        for p, ids in enumerate(partitions):
            txn = TxnId(self.app_id, sink.uid, epoch, round_, p, 7000 + p)
            open_ = sink.begin(txn, SCHEMA)
            sink.write(open_, rows(ids))
            handles.append(sink.prepare(open_))
        return handles

    def commit(
        self,
        sink: AnySink,
        epoch: int,
        handles: Sequence[Handle],
        partitions: Sequence[Sequence[int]] = (),
    ) -> list[Sequence[Handle]]:
        """``commit_epoch`` as the coordinator calls it; returns the units reported."""
        return commit(sink, epoch, handles, partitions)

    def seen(self, spec: Mapping[str, Any], expected: Iterable[int] = ()) -> tuple[list[int], int]:
        """What a reader sees now, and how many prepared leftovers the target holds."""
        verifier = self.adapter.verifier(spec, expected, self.env)
        return list(verifier.read_ids()), int(verifier.lingering())

    def in_child(self, op: str, sink: AnySink, **payload: Any) -> subprocess.CompletedProcess[str]:
        """Run ``op`` in a fresh Python process with the pickled sink (as Spark ships it)."""
        blob = Path(self.workdir, f"child-{uuid.uuid4().hex[:8]}.pickle")
        blob.write_bytes(pickle.dumps({"op": op, "sink": sink, "app": self.app_id, **payload}))
        return subprocess.run(
            [sys.executable, "-m", "txsink.testing.contract", str(blob)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, **self.adapter.child_env(self.env)},
        )

    def drop(self) -> None:
        for spec in self._made:
            self.adapter.drop_target(spec, self.env)


def commit(
    sink: AnySink,
    epoch: int,
    handles: Sequence[Handle],
    partitions: Sequence[Sequence[int]] = (),
) -> list[Sequence[Handle]]:
    """``sink.commit_epoch`` as the coordinator calls it (``partitions``: the epoch's ids,
    for a sink that commits from data); returns the units it reported as committed."""
    units: list[Sequence[Handle]] = []
    data = ListEpochData([[rows(ids)] for ids in partitions])
    request = EpochCommit(
        epoch, tuple(handles), data if sink.commits_from_data else None, units.append
    )
    sink.commit_epoch(request)
    return units


# -- the checks ----------------------------------------------------------------------------

PARTS = ((0, 1, 2), (100, 101))
IDS = [i for p in PARTS for i in p]


def nothing_visible_before_commit(run: ContractRun) -> None:
    spec, sink = run.target()
    handles = run.prepare(sink, 0, PARTS)
    seen, lingering = run.seen(spec, IDS)
    _expect(seen == [], f"prepared rows are visible before the commit: {seen}")
    if not sink.commits_from_data:
        _expect(lingering >= 1, "a prepared transaction is not durable in the target")
        listed = {str(h.txn) for h in sink.list_prepared(run.app_id)}
        _expect({str(h.txn) for h in handles} <= listed, f"list_prepared misses some: {listed}")
    units = run.commit(sink, 0, handles, PARTS)
    _expect(units, "commit_epoch reported no unit as committed (EpochCommit.committed)")
    seen, lingering = run.seen(spec, IDS)
    assert_exactly_once(IDS, seen, lingering=lingering, what="after commit")
    _expect(list(sink.list_prepared(run.app_id)) == [], "still listed as prepared after commit")


def commit_is_idempotent(run: ContractRun) -> None:
    spec, sink = run.target()
    handles = run.prepare(sink, 0, PARTS)
    run.commit(sink, 0, handles, PARTS)
    again = run.adapter.build_sink(spec, run.env)  # a new driver, after a crash mid-commit
    again.check(SCHEMA, run.app_id)
    run.commit(again, 0, [load_handle(dump_handle(h)) for h in handles], PARTS)
    run.commit(sink, 0, handles, PARTS)
    seen, lingering = run.seen(spec, IDS)
    assert_exactly_once(IDS, seen, lingering=lingering, what="after committing three times")


def abort_is_idempotent(run: ContractRun) -> None:
    spec, sink = run.target()
    handles = run.prepare(sink, 0, PARTS)
    for handle in handles:
        sink.abort(handle)
        sink.abort(handle)
    seen, lingering = run.seen(spec, IDS)
    _expect((seen, lingering) == ([], 0), f"after abort: visible {seen}, lingering {lingering}")
    _expect(list(sink.list_prepared(run.app_id)) == [], "still listed as prepared after abort")


def already_committed_is_verified(run: ContractRun) -> None:
    spec, sink = run.target()
    if sink.commits_from_data:
        return  # its commit writes from the epoch's rows: there is nothing to have aborted
    handles = run.prepare(sink, 0, PARTS)
    for handle in handles:
        sink.abort(handle)
    try:
        run.commit(sink, 0, handles, PARTS)
    except CommitError:
        pass
    else:
        raise AssertionError(
            "committing aborted transactions did not raise CommitError: 'already committed' "
            "was assumed, not verified in the target"
        )
    seen, _ = run.seen(spec, IDS)
    _expect(seen == [], f"aborted rows became visible: {seen}")


def crashed_attempt_is_listed(run: ContractRun) -> None:
    spec, sink = run.target()
    for op in ("prepare-and-die", "write-and-die"):
        done = run.in_child(op, sink, epoch=3, ids=[7, 8, 9])
        _expect(done.returncode == 86, f"the child did not die as planned: {done.stderr[-2000:]}")
    fresh = run.adapter.build_sink(spec, run.env)  # recovery, on a new driver
    for handle in list(fresh.list_prepared(run.app_id)):
        fresh.abort(handle)
    seen, lingering = run.seen(spec, [])
    _expect(
        (seen, lingering) == ([], 0),
        f"after recovery aborted what list_prepared found: visible {seen}, lingering {lingering}",
    )


def fresh_process_commits_from_the_handle(run: ContractRun) -> None:
    spec, sink = run.target()
    handles = run.prepare(sink, 0, PARTS)
    docs = [dump_handle(h) for h in handles]
    done = run.in_child("commit", sink, epoch=0, handles=json.dumps(docs), parts=PARTS)
    _expect(done.returncode == 0, f"the fresh process could not commit: {done.stderr[-2000:]}")
    seen, lingering = run.seen(spec, IDS)
    assert_exactly_once(IDS, seen, lingering=lingering, what="committed by a fresh process")


def empty_epoch_commits(run: ContractRun) -> None:
    spec, sink = run.target()
    run.commit(sink, 0, [], ())
    seen, lingering = run.seen(spec, [])
    _expect((seen, lingering) == ([], 0), f"an empty epoch left: {seen}, lingering {lingering}")


def recorded_epoch_is_reported(run: ContractRun) -> None:
    """A sink that implements ``recorded_epoch`` reports the epoch it committed, for its
    own app only; before any commit, nothing."""
    _spec, sink = run.target()
    _expect(sink.recorded_epoch(run.app_id) is None, "a fresh target reports a recorded epoch")
    run.commit(sink, 3, run.prepare(sink, 3, PARTS), PARTS)
    recorded = sink.recorded_epoch(run.app_id)
    if type(sink).recorded_epoch is SinkContract.recorded_epoch:
        return  # keeps no record of its own: nothing to report
    _expect(recorded == 3, f"after committing epoch 3, recorded_epoch says {recorded}")
    other = sink.recorded_epoch(f"{run.app_id}-other")
    _expect(other is None, f"another app's recorded_epoch says {other}")


CHECKS: list[Callable[[ContractRun], None]] = [
    nothing_visible_before_commit,
    commit_is_idempotent,
    abort_is_idempotent,
    already_committed_is_verified,
    crashed_attempt_is_listed,
    fresh_process_commits_from_the_handle,
    empty_epoch_commits,
    recorded_epoch_is_reported,
]
CHECK_NAMES = [check.__name__ for check in CHECKS]


# -- the child process ------------------------------------------------------------------


def _child(blob: Path) -> int:
    # Our own test wrote this file a moment ago: trusted input.
    job = pickle.loads(blob.read_bytes())  # noqa: S301
    sink: AnySink = job["sink"]
    if job["op"] == "commit":
        handles = [load_handle(doc) for doc in json.loads(job["handles"])]
        commit(sink, job["epoch"], handles, job["parts"])
        return 0
    txn = TxnId(job["app"], sink.uid, job["epoch"], 0, 5, 9000 + len(job["op"]))
    open_ = sink.begin(txn, SCHEMA)
    sink.write(open_, rows(job["ids"]))
    if job["op"] == "prepare-and-die":
        sink.prepare(open_)
    sys.stdout.flush()
    os._exit(86)  # a task process killed: no cleanup, no discard


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1])))
