"""What a new user trips over outside the protocol: the CLI piped into ``head``, and the
folders fault plans leave in the temporary folder."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from txsink import cli
from txsink.protocol.faults import FaultPlan

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_LOG = ROOT / "tests/golden/log-v1/files"


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``txsink ARGS`` with stdout a pipe whose reader has already gone (``| head`` after
    its lines)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "txsink.cli", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            check=False,
            timeout=120,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("json_flag", [["--json"], []], ids=["json", "table"])
def test_status_into_a_closed_pipe_ends_quietly(json_flag: list[str]) -> None:
    proc = _run_into_closed_pipe("status", "--log", str(GOLDEN_LOG), *json_flag)
    assert proc.stderr == b""  # no BrokenPipeError traceback, no "Exception ignored" at exit
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell reports `cat` killed by one


def test_a_broken_pipe_elsewhere_is_still_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a closed stdout/stderr is silenced; a pipe to anything else that breaks (a
    socket, a child process) stays an error."""

    def broken(argv: list[str] | None) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_run", broken)
    with pytest.raises(BrokenPipeError):
        cli.main(["status"])


def _plan_in_child(code: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ``FaultPlan`` imported) in a child whose temporary folder is
    ``tmp``; its stdout is returned."""
    return subprocess.run(
        [sys.executable, "-c", f"from txsink.protocol.faults import FaultPlan, CrashPoint\n{code}"],
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_a_plans_own_state_folder_goes_when_its_process_ends(tmp_path: Path) -> None:
    proc = _plan_in_child(
        "plan = FaultPlan.parse('after_decision:raise')\n"
        "try:\n"
        "    plan.fire(CrashPoint.AFTER_DECISION, epoch=0)\n"
        "except Exception:\n"
        "    pass\n"
        "print(plan.state_dir, plan.fired())",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    state_dir, fired = proc.stdout.split(" ", 1)
    assert Path(state_dir).parent == tmp_path and "after_decision" in fired
    assert list(tmp_path.iterdir()) == []  # the folder went with the process


def test_the_folder_of_a_killed_process_goes_with_the_next_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = _plan_in_child(
        "import os, signal\n"
        "plan = FaultPlan.parse('after_decision:kill-driver')\n"
        "print(plan.state_dir, flush=True)\n"
        "plan.fire(CrashPoint.AFTER_DECISION, epoch=0)",  # SIGKILLs itself: no exit handler
        tmp_path,
    )
    assert proc.returncode == -signal.SIGKILL
    orphan = Path(proc.stdout.strip())
    assert orphan.is_dir() and os.listdir(orphan) == ["00-after_decision-0"]
    # Folders that are not a dead process's own-made one stay: a live process's, the one
    # TXSINK_FAULT derives (shared by restarts on purpose), anything else.
    derived = tmp_path / "txsink-faults-0123456789ab"
    live = tmp_path / f"txsink-faults-{os.getpid()}-abcd1234"
    for keep in (derived, live):
        keep.mkdir()

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    plan = FaultPlan.parse("during_commit")
    assert not orphan.exists()
    assert derived.is_dir() and live.is_dir() and Path(plan.state_dir).is_dir()


@pytest.mark.parametrize(
    "project", [ROOT, ROOT / "docs/examples/txsink-sqlite"], ids=["txsink", "txsink-sqlite"]
)
def test_the_editable_installs_of_dev_warn_nothing(project: Path, tmp_path: Path) -> None:
    """``./dev`` installs both distributions editable: setuptools builds each wheel with no
    warning (a deprecated ``project.license`` table printed ~45 lines at every first
    ``./dev demo``), but for the note ``./dev`` filters with the same PYTHONWARNINGS."""
    dev_filter = re.search(r'PYTHONWARNINGS="([^"]+)"', (ROOT / "dev").read_text())
    assert dev_filter is not None
    # The project's own backend (txsink's wraps setuptools'), found as pip finds it.
    system = tomllib.loads((project / "pyproject.toml").read_text())["build-system"]
    paths = [str(project / p) for p in system.get("backend-path", [])]
    proc = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-W",
            dev_filter.group(1),
            "-c",
            "import importlib, sys; sys.path[:0] = sys.argv[3:]; "
            "importlib.import_module(sys.argv[2]).build_editable(sys.argv[1])",
            str(tmp_path),
            system["build-backend"],
            *paths,
        ],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(tmp_path.glob("*.whl"))
