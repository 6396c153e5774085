"""The demo and ``kill-driver`` faults: a fresh driver process per crash (SIGKILL is final).

The default suite kills the driver once at every crash point in a single
restarting run (seven crashes, eight runs). ``--run-slow`` adds one run per
crash point from a clean state.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.childrun import cli, demo, runner_cmd
from tests.streaming import EVERY_POINT_ONCE
from txsink.protocol.faults import SINGLE_PASS_POINTS, CrashPoint
from txsink.testing.inputs import make_input

pytestmark = [pytest.mark.chaos, pytest.mark.spark]


def test_plan_covers_every_crash_point() -> None:
    named = {spec.split(":")[0] for spec in EVERY_POINT_ONCE.split(",")}
    # The files sink prepares in its tasks and commits on the driver: every point but the
    # single-pass ones (integration/test_matrix.py covers those per sink that reaches them).
    assert named == {str(p) for p in CrashPoint} - SINGLE_PASS_POINTS


def test_kill_driver_at_every_point_in_one_run(tmp_path: Path) -> None:
    result = demo(tmp_path / "demo", rows=6000, files=6, crash=EVERY_POINT_ONCE, max_runs=12)
    assert result["faults_fired"] == 7, result
    assert result["restarts"] == 7, result
    assert (result["duplicates"], result["missing"], result["lingering"]) == (0, 0, 0), result
    assert result["rows_written"] == 6000 and result["epochs"] == 6 and result["ok"]


# The default suite runs these two through docs/quickstart.md (tests/test_docs.py): its
# "Crash it on purpose" block runs the same `txsink demo --crash after_decision:kill-driver`
# and compares every line it prints (these lines, the verdict's values), and its
# `txsink status` blocks read the first demo's log (table and --json).


@pytest.mark.slow
@pytest.mark.matrix("demo")
def test_demo_command_prints_one_json_verdict(tmp_path: Path) -> None:
    crash = "after_decision:kill-driver"
    proc = cli(
        "demo", "--rows", "3000", "--files", "2", "--workdir", str(tmp_path / "w"), "--crash", crash
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("rows_expected", "rows_written", "duplicates", "missing", "epochs", "output"):
        assert key in last
    assert (last["rows_expected"], last["rows_written"], last["duplicates"], last["missing"]) == (
        3000,
        3000,
        0,
        0,
    )
    assert last["restarts"] == 1
    err = proc.stderr
    assert (
        "txsink demo: query run 1 ended (killed by SIGKILL) after fault "
        "after_decision:kill-driver at epoch=0: killing the driver (pid "
    ) in err, err
    assert (
        "txsink: WARNING [demo] recovery: the previous run did not finish: epoch 0 is decided "
        "but not committed (commit it)"
    ) in err, err
    assert "txsink: [demo epoch 0] recovery: committed demo epoch 0 (2 handle(s))" in err, err
    assert "txsink: [demo epoch 0] already committed: Spark's replay skipped" in err, err
    assert re.search(r"txsink: \[demo epoch 1\] committed: demo 1,500 rows \(precommit ", err)


def test_kill_worker_demo_names_what_happened(tmp_path: Path) -> None:
    """The parent's output names the killed worker (partition, pid), the abort of the
    failed attempt's transactions, a clean failure line and why the run was restarted."""
    crash = "after_precommit:kill-worker#1"
    proc = cli(
        "demo", "--rows", "2000", "--files", "2", "--workdir", str(tmp_path / "w"), "--crash", crash
    )
    err = proc.stderr
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ok"]
    fault = re.search(
        r"^  txsink: injecting fault after_precommit:kill-worker#1 at epoch=0 partition=1: "
        r"killing this task's Python worker \(pid (\d+)\)",
        err,
        re.M,
    )
    assert fault, err
    # The killed attempt prepared before it died: the failed round's abort names it.
    assert re.search(
        r"^  txsink: \[demo epoch 0\] aborted txsink\.[\w-]+\.demo\.e0\.r0\.p1\.a\d+: "
        r"the pre-commit of epoch 0 round 0 failed$",
        err,
        re.M,
    ), err
    failed = [line for line in err.splitlines() if line.startswith("  txsink: query failed: ")]
    assert len(failed) == 1, err
    assert failed[0].startswith(
        "  txsink: query failed: EpochAbortedError: [epoch=0, phase=precommit] epoch 0 aborted, "
        "nothing of it is visible: Spark job failed: "
    ), failed
    assert "Python worker exited unexpectedly" in failed[0] and "Python Proxy" not in err
    # Cut at a word, or Spark's whole sentence (3.5's ends with "(crashed)").
    assert failed[0].endswith(("…", ".", "(crashed)")), failed
    assert (
        "txsink demo: query run 1 ended (exit code 1) after fault after_precommit:kill-worker#1 "
        f"at epoch=0 partition=1: killing this task's Python worker (pid {fault.group(1)}); "
        "restarting"
    ) in err, err
    assert re.search(r"^  txsink: \[demo epoch 0\] committed: demo 1,000 rows", err, re.M), err


def test_a_default_streaming_run_prints_one_line_per_epoch(tmp_path: Path) -> None:
    """The generic pipeline, logging unconfigured: txsink's own output is exactly one line
    per epoch; with TXSINK_LOG=off, nothing."""
    env = {k: v for k, v in os.environ.items() if k not in ("TXSINK_LOG", "TXSINK_FAULT")}

    def run(name: str, files: int, **more: str) -> subprocess.CompletedProcess[str]:
        workdir = tmp_path / name
        make_input(workdir / "input", 300 * files, files)
        spec = {"kind": "files", "path": str(workdir / "out"), "uid": "out"}
        args = {"workdir": str(workdir), "sinks": [spec]}
        return subprocess.run(
            runner_cmd("txsink.testing.pipelines:run_stream", args),
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
            env={**env, **more},
        )

    done = run("default", 3)
    ours = [line for line in done.stderr.splitlines() if line.startswith("txsink")]
    assert [re.sub(r"\(precommit .*\)$", "(...)", line) for line in ours] == [
        f"txsink: [out epoch {e}] committed: out 300 rows (...)" for e in range(3)
    ], done.stderr[-3000:]
    assert "txsink" not in done.stdout
    # One epoch shows silence as well as three: its commit is the line TXSINK_LOG=off hides.
    quiet = run("quiet", 1, TXSINK_LOG="off")
    said = (quiet.stderr + quiet.stdout).splitlines()
    assert not [line for line in said if line.startswith("txsink")], quiet.stderr[-3000:]


@pytest.mark.slow  # docs/quickstart.md's `txsink status` blocks (see above)
def test_status_command_reads_the_demo_log(tmp_path: Path) -> None:
    demo(tmp_path / "d", rows=1000, files=2, max_runs=2)
    proc = cli("status", "--log", str(tmp_path / "d" / "txlog"), "--json", check=True)
    doc = json.loads(proc.stdout)
    assert [e["status"] for e in doc["epochs"]] == ["committed", "committed"]
    log = str(tmp_path / "d" / "txlog")
    table = cli("status", "--log", log, check=True)
    assert "2 epochs, 2 committed" in table.stdout


def test_bad_crash_spec_is_a_clear_error(tmp_path: Path) -> None:
    proc = cli("demo", "--crash", "sometime", "--workdir", str(tmp_path))
    assert proc.returncode == 2 and "unknown crash point 'sometime'" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("point", [str(p) for p in CrashPoint])
@pytest.mark.parametrize("mode", ["kill-driver", "raise", "kill-worker"])
def test_demo_each_point_and_mode(tmp_path: Path, point: str, mode: str) -> None:
    if mode == "kill-worker" and point not in ("before_precommit", "after_precommit"):
        pytest.skip("kill-worker applies to task points only")
    result = demo(tmp_path / "demo", rows=4000, files=4, crash=f"{point}:{mode}", max_runs=6)
    assert result["faults_fired"] >= 1, result
    assert (result["duplicates"], result["missing"], result["lingering"]) == (0, 0, 0), result
