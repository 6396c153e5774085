"""The demo and ``kill-driver`` faults: a fresh driver process per crash (SIGKILL is final).

The default suite kills the driver once at every crash point in a single
restarting run (seven crashes, eight runs). ``--run-slow`` adds one run per
crash point from a clean state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.streaming import EVERY_POINT_ONCE
from txsink.connectors.files.demo import run_demo
from txsink.faults import CrashPoint

pytestmark = pytest.mark.chaos


def test_plan_covers_every_crash_point() -> None:
    named = {spec.split(":")[0] for spec in EVERY_POINT_ONCE.split(",")}
    assert named == {str(p) for p in CrashPoint}


def test_kill_driver_at_every_point_in_one_run(tmp_path: Path) -> None:
    result = run_demo(
        tmp_path / "demo",
        rows=6000,
        files=6,
        partitions=2,
        crash=EVERY_POINT_ONCE,
        fmt="parquet",
        max_runs=12,
        echo=False,
    )
    assert result["faults_fired"] == 7, result
    assert result["restarts"] == 7, result
    assert (result["duplicates"], result["missing"], result["lingering"]) == (0, 0, 0), result
    assert result["rows_written"] == 6000 and result["epochs"] == 6 and result["ok"]


def test_demo_command_prints_one_json_verdict(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "txsink.cli",
            "demo",
            "--rows",
            "3000",
            "--files",
            "2",
            "--workdir",
            str(tmp_path / "w"),
            "--crash",
            "after_decision:kill-driver",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
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
    assert "restarting" in proc.stderr and "recovery finishes decided epoch" in proc.stderr


def test_status_command_reads_the_demo_log(tmp_path: Path) -> None:
    run_demo(
        tmp_path / "d",
        rows=1000,
        files=2,
        partitions=2,
        crash=None,
        fmt="parquet",
        max_runs=2,
        echo=False,
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "txsink.cli",
            "status",
            "--log",
            str(tmp_path / "d" / "txlog"),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(proc.stdout)
    assert [e["status"] for e in doc["epochs"]] == ["committed", "committed"]
    log = str(tmp_path / "d" / "txlog")
    table = subprocess.run(
        [sys.executable, "-m", "txsink.cli", "status", "--log", log],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "2 epochs, 2 committed" in table.stdout


def test_bad_crash_spec_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "txsink.cli",
            "demo",
            "--crash",
            "sometime",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "unknown crash point 'sometime'" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("point", [str(p) for p in CrashPoint])
@pytest.mark.parametrize("mode", ["kill-driver", "raise", "kill-worker"])
def test_demo_each_point_and_mode(tmp_path: Path, point: str, mode: str) -> None:
    if mode == "kill-worker" and point not in ("before_precommit", "after_precommit"):
        pytest.skip("kill-worker applies to task points only")
    result = run_demo(
        tmp_path / "demo",
        rows=4000,
        files=4,
        partitions=2,
        crash=f"{point}:{mode}",
        fmt="parquet",
        max_runs=6,
        echo=False,
    )
    assert result["faults_fired"] >= 1, result
    assert (result["duplicates"], result["missing"], result["lingering"]) == (0, 0, 0), result
