"""``foreachBatch(coordinator)`` through a real Spark Connect server (issue 16, part 1).

The client runs in a child process (``connect_jobs.py``: a Connect session cannot share a
process with the suite's classic one); PySpark pickles the coordinator to the server, whose
``foreachBatch`` process runs the protocol. Every test reads the real target back: each id
exactly once, nothing lingering.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from connect_server import ConnectServer, client_cmd, client_env
from cross import Cross

from conftest import services_for
from txsink.connectors.files.testing import verify_files
from txsink.ops.checkpoint import inspect_checkpoint
from txsink.protocol.log import open_log
from txsink.runner import RunReport, run_until_done
from txsink.spark.versions import spark_line
from txsink.testing.adapter import adapters
from txsink.testing.hooks import PointHooks
from txsink.testing.inputs import append_input, make_input
from txsink.testing.targets import new_targets
from txsink.testing.verifiers import Verdict, verify

# Starts Spark drivers in child processes: the session builds the CDS archive first.
pytestmark = pytest.mark.spark

JOBS = str(Path(__file__).resolve().parent / "connect_jobs.py")
ROWS, FILES = 400, 4


def _app_id(tmp: Path) -> str:
    """One app id per test: an app id names a pipeline in its targets too (Kafka's commit
    markers are keyed by app id and sink uid), so a new log needs a new one."""
    return f"connect-{tmp.name}-{uuid.uuid5(uuid.NAMESPACE_URL, str(tmp)).hex[:8]}"


def _files_spec(tmp: Path) -> dict[str, Any]:
    return {"kind": "files", "path": str(tmp / "out"), "uid": "out", "format": "parquet"}


def _run(
    server: ConnectServer,
    tmp: Path,
    *,
    max_runs: int = 1,
    env: dict[str, str] | None = None,
    lines: list[str] | None = None,
    **kwargs: Any,
) -> RunReport:
    kwargs.setdefault("sinks", [_files_spec(tmp)])
    kwargs.setdefault("app_id", _app_id(tmp))
    cmd = client_cmd(server, f"{JOBS}:stream", workdir=str(tmp), **kwargs)
    seen = lines if lines is not None else []
    return run_until_done(
        cmd,
        env={**client_env(server), **(env or {})},
        max_runs=max_runs,
        on_line=seen.append,
        timeout=300,
    )


def _assert_files_exactly_once(tmp: Path, rows: int = ROWS) -> Verdict:
    verdict = verify_files(tmp / "out", range(rows), uid="out")
    assert verdict.ok, verdict
    assert verdict.lingering == 0, verdict
    return verdict


@pytest.mark.matrix("connect")
def test_files_sink_through_connect(connect_server: ConnectServer, tmp_path: Path) -> None:
    make_input(tmp_path / "input", rows=ROWS, files=FILES)
    lines: list[str] = []
    spec = {**_files_spec(tmp_path), "uid": "connect-files"}
    report = _run(connect_server, tmp_path, lines=lines, sinks=[spec])
    assert report.finished, "\n".join(lines[-30:])
    verdict = verify_files(tmp_path / "out", range(ROWS), uid="connect-files")
    assert verdict.ok and verdict.lingering == 0, verdict
    assert verdict.epochs == FILES
    # txsink's console line is printed where the coordinator runs: the server's process.
    assert not any(" committed: " in line for line in lines), lines
    served = connect_server.log_path.read_text(errors="replace")
    last = f"txsink: [connect-files epoch {FILES - 1}] committed: connect-files 100 rows"
    assert last in served
    log = open_log(tmp_path / "txlog")
    assert log.last_committed() == FILES - 1
    assert (log.meta() or {}).get("app_id") == _app_id(tmp_path)


def test_the_client_follows_the_epoch_lines(connect_server: ConnectServer, tmp_path: Path) -> None:
    """``with coordinator.follow(query)``: the client prints each epoch's line, read from
    the log (a path the client shares here), once, and stops with the query."""
    make_input(tmp_path / "input", rows=40, files=2)
    lines: list[str] = []
    spec = {**_files_spec(tmp_path), "uid": "followed"}
    report = _run(connect_server, tmp_path, lines=lines, sinks=[spec], follow=True)
    assert report.finished, "\n".join(lines[-30:])
    told = [line.split(" (")[0] for line in lines if line.startswith("txsink: ")]
    assert told == [
        f"txsink: [followed epoch {epoch}] committed: followed 20 rows" for epoch in (0, 1)
    ], lines
    verdict = verify_files(tmp_path / "out", range(40), uid="followed")
    assert verdict.ok and verdict.lingering == 0, verdict


def test_without_app_id_connect_refuses_before_writing(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    make_input(tmp_path / "input", rows=40, files=1)
    lines: list[str] = []
    report = _run(connect_server, tmp_path, lines=lines, app_id=None)
    assert not report.finished
    # Told where the coordinator runs: the server's foreachBatch process.
    served = connect_server.log_path.read_text(errors="replace")
    assert "ConfigurationError: [phase=check] txsink.Coordinator runs under Spark Connect" in served
    failure = (tmp_path / "failure.txt").read_text()
    # Spark 4 carries that process's error to the client; 3.5's Connect fails the client's
    # query with STREAM_FAILED alone (the reason stays in the server's log).
    if spark_line() != "3.5":
        assert "ConfigurationError" in failure and "under Spark Connect" in failure, failure
        assert "pass app_id=... to the Coordinator" in failure, failure
    assert not (tmp_path / "txlog").exists()
    assert not (tmp_path / "out").exists() or verify_files(tmp_path / "out", []).rows_written == 0


@pytest.mark.matrix("connect")
def test_crashes_in_tasks_and_in_the_foreachbatch_process(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """A raise in a task (Spark retries it), a SIGKILLed task worker (retried), and a
    SIGKILLed foreachBatch process after the decision (the query fails; the restarted
    query's first batch recovers: the decision stands)."""
    make_input(tmp_path / "input", rows=ROWS, files=FILES)
    plan = "after_precommit:raise@0#0,after_precommit:kill-worker@1#1,after_decision:kill-driver@2"
    lines: list[str] = []
    report = _run(connect_server, tmp_path, max_runs=3, lines=lines, faults=plan)
    assert report.finished, "\n".join(lines[-40:])
    assert report.runs == 2, report  # only the foreachBatch kill fails the query
    fired = sorted(os.listdir(tmp_path / "faults"))
    assert len(fired) == 3, fired
    _assert_files_exactly_once(tmp_path)


@pytest.mark.slow
def test_drop_in_sink_through_connect(connect_server: ConnectServer, tmp_path: Path) -> None:
    make_input(tmp_path / "input", rows=100, files=2)
    report = _run(connect_server, tmp_path, drop_in=True)
    assert report.finished
    _assert_files_exactly_once(tmp_path, 100)


def test_spark_refuses_the_modes_the_guard_refuses(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """Under Connect txsink cannot inspect the query (no py4j): Spark refuses continuous
    triggers and async progress tracking for foreachBatch at start() itself."""
    out = tmp_path / "answers.json"
    cmd = client_cmd(connect_server, f"{JOBS}:start_modes", workdir=str(tmp_path), out=str(out))
    done = subprocess.run(
        cmd,
        env=client_env(connect_server),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(out.read_text())
    assert "'foreachBatch' is not supported with continuous trigger" in answers["continuous"]
    assert "does not support async progress tracking" in answers["async"]


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _decided(log_dir: Path, epoch: int) -> bool:
    return log_dir.is_dir() and open_log(log_dir).decision(epoch) is not None


def _start_client(server: ConnectServer, tmp: Path, **kwargs: Any) -> subprocess.Popen[str]:
    kwargs.setdefault("sinks", [_files_spec(tmp)])
    cmd = client_cmd(server, f"{JOBS}:stream", workdir=str(tmp), app_id=_app_id(tmp), **kwargs)
    return subprocess.Popen(
        cmd,
        env=client_env(server),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


@pytest.mark.slow
def test_a_killed_client_process(connect_server: ConnectServer, tmp_path: Path) -> None:
    """SIGKILL of the client once epoch 1 is decided: the query lives on in the server (or
    is stopped when the restarted client starts it again); either way exactly once."""
    make_input(tmp_path / "input", rows=ROWS, files=FILES)
    client = _start_client(connect_server, tmp_path)
    try:
        _wait_for(lambda: _decided(tmp_path / "txlog", 1), 240, "epoch 1's decision")
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait(30)
    report = _run(connect_server, tmp_path, max_runs=3)
    assert report.finished, report
    _assert_files_exactly_once(tmp_path)


@pytest.mark.slow
def test_a_killed_connect_server_restarted(connect_server: ConnectServer, tmp_path: Path) -> None:
    """SIGKILL of the whole server (its JVM and Python processes) while the foreachBatch
    process waits right after epoch 1's decision (a hook); the server restarts, the query
    restarts from its checkpoint and its first batch finishes the decided epoch."""
    make_input(tmp_path / "input", rows=ROWS, files=FILES)
    hooks = PointHooks(tmp_path / "hooks")
    hooks.at("after_decision", connect_server.kill, epoch=1)
    hook = {"folder": str(tmp_path / "hooks"), "point": "after_decision", "epoch": 1}
    with hooks:
        client = _start_client(connect_server, tmp_path, hook=hook)
        try:
            _wait_for(
                lambda: connect_server.proc is not None and connect_server.proc.poll() is not None,
                240,
                "the server's kill at epoch 1's decision",
            )
            # The client keeps retrying a server that is gone (Connect's retry policy): it
            # is the dead driver's client; the one below is a new one, as a supervisor's.
            with contextlib.suppress(subprocess.TimeoutExpired):
                client.wait(5)
        finally:
            if client.poll() is None:
                client.kill()
                client.wait(30)
            connect_server.start()
    log = open_log(tmp_path / "txlog")
    assert log.decision(1) is not None and log.committed(1) is None  # killed in between
    report = _run(connect_server, tmp_path, max_runs=3)
    assert report.finished, report
    _assert_files_exactly_once(tmp_path)
    assert log.last_committed() == FILES - 1


@pytest.mark.slow
def test_server_sinks_through_connect(connect_server: ConnectServer, cross: Cross) -> None:
    """Postgres, Kafka and S3 behind one coordinator through Connect, with the foreachBatch
    process killed after epoch 1's decision: read back from the real targets."""
    tmp = cross.tmp
    make_input(tmp / "input", rows=ROWS, files=FILES)
    lines: list[str] = []
    report = _run(
        connect_server,
        tmp,
        max_runs=3,
        lines=lines,
        env=cross.child_env(),
        sinks=cross.specs(),
        log=cross.log,
        faults="after_decision:kill-driver@1",
    )
    assert report.finished, "\n".join(lines[-40:])
    assert report.runs == 2, report
    verdicts = cross.verdicts(ROWS)
    assert all(v.ok and v.lingering == 0 for v in verdicts.values()), verdicts


@pytest.mark.slow
@pytest.mark.kafka
def test_kafka_direct_single_pass_through_connect(
    connect_server: ConnectServer, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Kafka's direct mode (a barrier stage whose tasks vote to the coordinator in the
    foreachBatch process and commit in the task), with that process killed after epoch 1's
    decision: the replay commits the decided shards."""
    env: dict[str, str] = {}
    for service in services_for(request, ["kafka"]).values():
        env.update(service.env())
    options = {"kafka": dict(adapters()["kafka"].variants["direct"])}
    (target,) = new_targets(["kafka"], tmp_path, tag="cx", env=env, options=options)
    request.addfinalizer(lambda: target.adapter.drop_target(target.spec, target.env))
    make_input(tmp_path / "input", rows=ROWS, files=FILES)
    lines: list[str] = []
    report = _run(
        connect_server,
        tmp_path,
        max_runs=3,
        lines=lines,
        env=target.child_env(),
        sinks=[target.spec],
        faults="after_decision:kill-driver@1",
    )
    assert report.finished, "\n".join(lines[-40:])
    assert report.runs == 2, report
    verdict = verify(target.verifier(range(ROWS), log=str(tmp_path / "txlog")))
    assert verdict.ok and verdict.lingering == 0, verdict


@pytest.mark.slow
def test_a_classic_pipeline_moves_to_connect_with_its_query_id(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """A classic query writes epochs 0-1; the same checkpoint and log go on through Connect
    with app_id = the classic query's id (the checkpoint's metadata): epochs 2-3 follow,
    every row once."""
    make_input(tmp_path / "input", rows=200, files=2)
    classic = run_until_done(
        [
            sys.executable,
            "-m",
            "txsink.runner",
            "txsink.testing.pipelines:run_stream",
            json.dumps({"workdir": str(tmp_path), "sinks": [_files_spec(tmp_path)]}),
        ],
        max_runs=1,
        timeout=300,
    )
    assert classic.finished
    query_id = inspect_checkpoint(tmp_path / "checkpoint").query_id
    assert query_id is not None
    append_input(tmp_path / "input", first_id=200, rows=200, first_file=2, files=2)
    report = _run(connect_server, tmp_path, app_id=query_id)
    assert report.finished, report
    _assert_files_exactly_once(tmp_path)
    assert open_log(tmp_path / "txlog").last_committed() == 3
