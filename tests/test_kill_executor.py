"""The ``kill-executor`` fault mode: parsing, finding the executor JVM, refusal in local mode.

The real kills run on a standalone cluster in integration/test_cluster.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from txsink.errors import ConfigurationError, EpochAbortedError
from txsink.kit.procs import _ppid_from_stat
from txsink.protocol.faults import (
    EXECUTOR_MAIN_CLASSES,
    CrashPoint,
    Fault,
    FaultMode,
    FaultPlan,
    find_executor_jvm,
)

EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
SUBMIT = "org.apache.spark.deploy.SparkSubmit"


# -- parsing ---------------------------------------------------------------------------


def test_parse_kill_executor() -> None:
    fault = Fault.parse("after_precommit:kill-executor@2#1*3")
    assert fault == Fault(CrashPoint.AFTER_PRECOMMIT, FaultMode.KILL_EXECUTOR, 2, 1, 3)
    assert str(fault) == "after_precommit:kill-executor@2#1*3"
    assert Fault.parse(str(fault)) == fault
    assert Fault.parse("before_precommit:kill-executor").mode is FaultMode.KILL_EXECUTOR


def test_kill_executor_in_a_plan_with_other_modes() -> None:
    plan = FaultPlan.parse(
        "before_precommit:kill-executor@0#1, after_decision:kill-driver@1, during_commit",
        "/nonexistent",
    )
    assert [f.mode for f in plan.faults] == [
        FaultMode.KILL_EXECUTOR,
        FaultMode.KILL_DRIVER,
        FaultMode.RAISE,
    ]


@pytest.mark.parametrize(
    "point",
    [
        "during_recovery",
        "before_decision",
        "after_decision",
        "during_commit",
        "after_commit_before_mark",
    ],
)
def test_kill_executor_at_a_driver_point_is_rejected(point: str) -> None:
    with pytest.raises(ValueError, match=rf"fault {point}:kill-executor: there is no executor"):
        Fault.parse(f"{point}:kill-executor")


def test_unknown_mode_lists_kill_executor() -> None:
    with pytest.raises(ValueError, match=r"'kill-executor'"):
        Fault.parse("after_precommit:kill-exec")


def test_existing_modes_unchanged() -> None:
    with pytest.raises(ValueError, match=r"there is no Python worker at a driver-side point"):
        Fault.parse("after_decision:kill-worker")
    assert Fault.parse("after_decision:kill-driver").mode is FaultMode.KILL_DRIVER
    assert Fault.parse("after_decision").mode is FaultMode.RAISE


# -- finding the executor JVM ------------------------------------------------------------


@pytest.mark.parametrize(
    ("stat", "ppid"),
    [
        ("1234 (java) S 1200 1234 1234 0 -1", 1200),
        ("1234 (odd) name (x)) R 77 1 1", 77),  # comm with spaces and parentheses
        ("garbage", None),
    ],
)
def test_ppid_from_stat(stat: str, ppid: int | None) -> None:
    assert _ppid_from_stat(stat) == ppid


_PROBE = (
    "from txsink.protocol.faults import find_executor_jvm; import os; print(find_executor_jvm())"
)


def _probe_under(*ancestors: str) -> tuple[str, list[int]]:
    """Run the probe below shells whose command lines name ``ancestors`` (outermost first).

    Each shell is ``bash -c 'CHILD; true' NAME``: the ``; true`` keeps bash from exec-ing
    the child, so every shell stays an ancestor with NAME on its command line. Returns the
    probe's answer and the shells' pids (outermost first).
    """
    command = f"{sys.executable} -c '{_PROBE}'"
    for name in reversed(ancestors):
        inner = command.replace("'", "'\"'\"'")
        command = f"echo $$ >&2; bash -c '{inner}; true' {name}"
    done = subprocess.run(
        ["bash", "-c", f"{command}; true"], capture_output=True, text=True, check=True
    )
    return done.stdout.strip(), [int(p) for p in done.stderr.split()]


def test_finds_the_nearest_executor_ancestor() -> None:
    answer, shells = _probe_under("unrelated", EXECUTOR, "pyspark.daemon")
    assert answer == str(shells[2]), (answer, shells)


def test_stops_at_the_driver_jvm() -> None:
    # local mode: the Python worker's ancestors are the driver JVM (SparkSubmit) and above
    answer, _ = _probe_under(EXECUTOR, SUBMIT, "pyspark.daemon")
    assert answer == "None"


def test_no_executor_ancestor() -> None:
    assert find_executor_jvm() is None
    assert "org.apache.spark.executor.CoarseGrainedExecutorBackend" in EXECUTOR_MAIN_CLASSES


# -- refusal where there is no executor --------------------------------------------------


def test_fire_refuses_without_an_executor_and_stays_armed(tmp_path: Path) -> None:
    plan = FaultPlan.parse("before_precommit:kill-executor", str(tmp_path / "faults"))
    with pytest.raises(ConfigurationError, match=r"runs in no executor JVM of its own") as info:
        plan.fire(CrashPoint.BEFORE_PRECOMMIT, epoch=0, partition=0)
    assert info.value.epoch == 0 and info.value.partition == 0
    assert plan.fired() == [], "a refused fault must not count as fired"
    plan.fire(CrashPoint.AFTER_PRECOMMIT, epoch=0, partition=0)  # other points: no-op


@pytest.mark.spark
def test_local_mode_query_fails_loudly(spark: Any, tmp_path: Path) -> None:
    from tests.streaming import files_coordinator
    from txsink.connectors.files import read_committed

    plan = FaultPlan.parse("after_precommit:kill-executor", str(tmp_path / "faults"))
    coordinator = files_coordinator(tmp_path, faults=plan, app_id="local-kill-executor")
    with pytest.raises(EpochAbortedError, match=r"kill-executor.*no executor JVM"):
        coordinator(spark.range(0, 100).repartition(2), 0)
    assert plan.fired() == []
    assert not (tmp_path / "output").exists() or read_committed(tmp_path / "output").num_rows == 0
