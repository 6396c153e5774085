"""The Delta connector on the test S3 server (MinIO): the contract suite, racing commits
(delta-rs' conditional PUT of each log entry, no locking provider), and crash-matrix cells.

The adapter's variants (``local``, ``partitioned``) run everywhere through
integration/test_contract.py and integration/test_matrix.py; a table on S3 is the ``s3``
option of the same adapter, run here against the harness's server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _services.fixtures import S3Service
from deltalake import DeltaTable

from tests.streaming import fault_spec, is_task_point, prepare_input, run_until_done
from txsink import Coordinator
from txsink.connectors.delta import DeltaHandle, DeltaSink
from txsink.connectors.delta.commit import app_txn_id
from txsink.connectors.delta.testing import ADAPTER, storage_options
from txsink.contract import EpochCommit
from txsink.protocol.faults import FaultPlan
from txsink.testing import contract
from txsink.testing.targets import new_targets
from txsink.testing.verifiers import verify
from txsink.txid import TxnId

pytestmark = pytest.mark.s3


@pytest.mark.parametrize("check", contract.CHECKS, ids=contract.CHECK_NAMES)
def test_contract_on_s3(
    s3: S3Service, tmp_path: Path, check: Callable[[contract.ContractRun], None]
) -> None:
    run = contract.ContractRun(ADAPTER, tmp_path, env=s3.env(), options={"s3": True})
    try:
        check(run)
    finally:
        run.drop()


def _prepared(sink: DeltaSink, app: str, epoch: int, ids: list[int]) -> DeltaHandle:
    open_ = sink.begin(TxnId(app, sink.uid, epoch, 0, 0, 1), contract.SCHEMA)
    sink.write(open_, contract.rows(ids))
    return sink.prepare(open_)


def test_racing_commits_on_minio_land_once(s3: S3Service, tmp_path: Path) -> None:
    """Four drivers at once: two sinks appending their own epoch (both land, delta-rs retries
    the loser of the conditional PUT), and two drivers of one sink committing the same epoch
    (the table records it once: the loser re-reads the txn version)."""
    spec = ADAPTER.new_target(tmp_path, "race", s3.env())
    try:
        env = s3.env()
        sinks = [ADAPTER.build_sink({**spec, "uid": uid}, env) for uid in ("a", "b", "a", "b")]
        for sink in sinks:
            sink.check(contract.SCHEMA, "app")
        handles = [
            _prepared(sinks[0], "app", 0, [1, 2]),
            _prepared(sinks[1], "app", 0, [3, 4]),
        ]
        start = threading.Barrier(4)
        errors: list[BaseException] = []

        def commit(sink: Any, handle: DeltaHandle) -> None:
            start.wait()
            try:
                sink.commit_epoch(EpochCommit(0, (handle,)))
            except BaseException as err:
                errors.append(err)

        threads = [
            threading.Thread(target=commit, args=(sink, handles[i % 2]))
            for i, sink in enumerate(sinks)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        table = DeltaTable(spec["table"], storage_options=storage_options(spec["table"], env))
        assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3, 4]
        assert table.version() == 2  # the creation, then one commit per sink
        assert table.transaction_version(app_txn_id("app", "a")) == 0
        assert table.transaction_version(app_txn_id("app", "b")) == 0
    finally:
        ADAPTER.drop_target(spec, s3.env())


@pytest.mark.spark
@pytest.mark.parametrize(
    ("point", "mode"),
    [("after_decision", "raise"), ("during_commit", "raise"), ("after_precommit", "kill-worker")],
)
def test_crash_cells_on_s3(
    spark: Any, s3: S3Service, request: pytest.FixtureRequest, tmp_path: Path, point: str, mode: str
) -> None:
    """The crash matrix's quick cells with the table on S3 (the rest: local tables)."""
    (target,) = new_targets(
        ["delta"], tmp_path, tag="dmx", env=s3.env(), options={"delta": {"s3": True}}
    )
    request.addfinalizer(lambda: target.adapter.drop_target(target.spec, target.env))
    rows, files = 600, 3
    prepare_input(tmp_path, rows, files)
    plan = FaultPlan.parse(fault_spec(point, mode, 1), str(tmp_path / "faults"))
    log = str(tmp_path / "txlog")
    restarts, _ = run_until_done(
        spark, tmp_path, lambda: Coordinator([target.sink()], log=log, faults=plan)
    )
    assert len(plan.fired()) == len(plan.faults), "the fault never fired: test is void"
    assert restarts == (0 if is_task_point(point) else 1)
    verdict = verify(target.verifier(range(rows), log=log))
    assert verdict.ok, verdict
    assert verdict.epochs == files
