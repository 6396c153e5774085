"""The ``kill-target`` fault mode and its supervisor (:mod:`txsink.testing.chaos.targetcrash`).

No Spark here: the fault fires in this process or in a tiny child pipeline, and the
"server" is either a flag file (to follow the supervisor's steps) or a real process (an
HTTP server, for :class:`ServerProcess`'s SIGKILL and restart). The real targets crash in
``integration/test_target_crash.py``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import txsink.protocol.faults
from txsink.errors import InjectedFault
from txsink.protocol.faults import CrashPoint, Fault, FaultMode, FaultPlan
from txsink.testing import ChaosPlan, IdsVerifier, ServerProcess, TargetCrashes, run_chaos
from txsink.testing.chaos.soaklog import done_indices, settings_line, summary


class FlagServer:
    """A "server" that is up while its flag file exists; counts kills and starts."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag
        self.flag.touch()
        self.kills = self.starts = 0

    def kill(self) -> None:
        self.flag.unlink()
        self.kills += 1

    def start(self) -> None:
        self.flag.touch()
        self.starts += 1

    def running(self) -> bool:
        return self.flag.exists()


def test_kill_target_spec_round_trips_and_is_validated() -> None:
    fault = Fault.parse("after_decision:kill-target=postgres@1")
    assert fault.mode is FaultMode.KILL_TARGET and fault.target == "postgres" and fault.epoch == 1
    assert str(fault) == "after_decision:kill-target=postgres@1"
    assert Fault.parse("after_precommit:kill-target#0").target is None
    with pytest.raises(ValueError, match="kill-target only"):
        Fault.parse("after_decision:raise=postgres")
    with pytest.raises(ValueError, match="letters"):
        Fault(CrashPoint.AFTER_DECISION, FaultMode.KILL_TARGET, target="a b")


def test_random_plans_draw_a_named_target_and_keep_old_plans() -> None:
    with pytest.raises(ValueError, match="targets"):
        ChaosPlan.random(1, epochs=3, modes=["kill-target"])
    drawn = [
        ChaosPlan.random(s, epochs=3, modes=["kill-target"], targets=["pg", "s3"])
        for s in range(30)
    ]
    assert {f.target for p in drawn for f in p.faults} == {"pg", "s3"}
    # Plans without kill-target draw exactly what they drew before the mode existed.
    old = ChaosPlan.random(300, epochs=3, partitions=2, modes=["raise", "kill-driver"])
    assert (
        old.spec == ChaosPlan.random(300, 3, 2, modes=["raise", "kill-driver"], targets=["x"]).spec
    )


def test_a_firing_fault_waits_for_the_supervisor_to_kill_the_server(tmp_path: Path) -> None:
    server = FlagServer(tmp_path / "up")
    plan = FaultPlan.parse("after_decision:kill-target=pg@2", str(tmp_path / "state"))
    with TargetCrashes(plan.state_dir, {"pg": server}, down_s=0.2) as crashes:
        plan.fire(CrashPoint.AFTER_DECISION, epoch=1)  # another epoch: nothing
        assert server.kills == 0
        plan.fire(CrashPoint.AFTER_DECISION, epoch=2)
        assert server.kills == 1 and not server.running()  # dead when fire() returns
        plan.fire(CrashPoint.AFTER_DECISION, epoch=2)  # fired once: never again
        assert server.kills == 1
        assert plan.fired() == ["00-after_decision-0"]  # the request is no marker
        crashes.restore()
        assert server.running() and server.starts == 1
        assert crashes.kills[0].target == "pg" and crashes.kills[0].down_s is not None
        assert crashes.kills[0].down_s >= 0.2


def test_without_a_supervisor_the_fault_says_how_to_serve_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(txsink.protocol.faults, "TARGET_KILL_WAIT_S", 0.3)
    plan = FaultPlan.parse("after_decision:kill-target", str(tmp_path / "state"))
    with pytest.raises(InjectedFault, match=r"run_chaos\(\.\.\., targets=") as err:
        plan.fire(CrashPoint.AFTER_DECISION, epoch=0)
    assert err.value.epoch == 0


def test_an_unknown_target_fails_the_firing_process_loudly(tmp_path: Path) -> None:
    server = FlagServer(tmp_path / "up")
    plan = FaultPlan.parse("after_decision:kill-target=kafka", str(tmp_path / "state"))
    with (
        TargetCrashes(plan.state_dir, {"pg": server}) as crashes,
        pytest.raises(InjectedFault, match="no such target; registered: \\['pg'\\]"),
    ):
        plan.fire(CrashPoint.AFTER_DECISION, epoch=0)
    assert server.kills == 0 and crashes.errors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_server_process_sigkills_a_real_server_and_starts_it_again(tmp_path: Path) -> None:
    port = _free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        (tmp_path / "pid").write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + 30
        while not control.running() and time.monotonic() < deadline:
            time.sleep(0.05)

    control = ServerProcess("web", start, port, pid_file=str(tmp_path / "pid"))
    try:
        start()
        assert control.running()
        control.kill()
        assert procs[0].wait(5) == -9 and not control.running() and control.kills == 1
        control.start()
        assert control.running() and procs[1].poll() is None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    with pytest.raises(ValueError, match="exactly one of pid_file, pid"):
        ServerProcess("web", start, port)


TINY = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from txsink.protocol.faults import CrashPoint, FaultPlan

    def run(out, flag, ids):
        plan = FaultPlan.from_env()
        if plan is not None:
            plan.fire(CrashPoint.AFTER_DECISION, epoch=0)
        if not Path(flag).exists():   # the server is down: the query fails
            sys.exit(3)
        Path(out).write_text(json.dumps(ids))
    """
)


def test_run_chaos_kills_the_server_and_brings_it_back_before_the_restart(
    tmp_path: Path,
) -> None:
    pipeline = tmp_path / "tiny.py"
    pipeline.write_text(TINY)
    out = tmp_path / "out.json"
    server = FlagServer(tmp_path / "up")
    report = run_chaos(
        f"{pipeline}:run",
        "after_decision:kill-target=db@0",
        workdir=tmp_path / "w",
        args={"out": str(out), "flag": str(server.flag), "ids": [1, 2, 3]},
        sinks_verifiers={
            "tiny": IdsVerifier(
                [1, 2, 3], lambda: json.loads(out.read_text()) if out.exists() else []
            )
        },
        targets={"db": server},
        down_s=0.1,
    )
    assert report.ok and report.restarts == 1 and report.exit_codes == [3, 0], report.table()
    assert server.kills == 1 and server.starts == 1
    assert len(report.faults_fired) == 1 and report.target_kills[0].startswith("db killed by fault")
    assert "servers killed: db killed" in report.table()


def test_soak_results_file_resumes_and_tallies(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    settings = settings_line(seed=1, connectors=["files"], modes=["raise", "kill-target"])
    other = settings_line(seed=2, connectors=["files"], modes=["raise"])
    report = {
        "plan": "after_decision:kill-target=postgres@1",
        "ok": True,
        "restarts": 1,
        "faults_fired": 1,
        "faults_planned": 1,
        "violations": 0,
        "recovery_seconds": [4.0],
        "target_kills": ["postgres killed by fault 00-after_decision-0, down 2.0s"],
    }
    lines = [
        {"soak": settings, "index": 0, "report": report},
        {
            "soak": settings,
            "index": 2,
            "report": {**report, "plan": "before_decision:raise@0", "target_kills": []},
        },
        {"soak": other, "index": 1, "report": report},
    ]
    results.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"cut short')
    assert done_indices(results, settings) == {0, 2}
    assert done_indices(results, other) == {1}
    table = summary(results)
    assert "| 3 | 1, 2 | files | 3 | 3 / 3 | 2 | **0** |" in table
    assert "| `kill-target` | 2 | 0 |" in table and "| postgres | 2 | 2 | 0 |" in table


def test_cli_chaos_run_kills_a_target_and_tallies_a_results_file(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(TINY)
    flag = tmp_path / "up"
    flag.touch()
    (tmp_path / "servers.py").write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path
            FLAG = Path({str(flag)!r})

            class Flag:
                def kill(self): FLAG.unlink()
                def start(self): FLAG.touch()
                def running(self): return FLAG.exists()

            def make():
                return {{"db": Flag()}}

            def checks(args):
                import json
                from txsink.testing import IdsVerifier
                return {{"tiny": IdsVerifier(args["ids"], lambda: json.load(open(args["out"])))}}
            """
        )
    )
    args = {"out": str(tmp_path / "out.json"), "flag": str(flag), "ids": [0, 1]}
    common = [sys.executable, "-m", "txsink.cli", "chaos"]
    proc = subprocess.run(
        [
            *common,
            "run",
            "--pipeline",
            f"{tmp_path / 'tiny.py'}:run",
            "--args",
            json.dumps(args),
            "--plan",
            "after_decision:kill-target=db@0",
            "--targets",
            f"{tmp_path / 'servers.py'}:make",
            "--down",
            "0.1",
            "--verifiers",
            f"{tmp_path / 'servers.py'}:checks",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["restarts"] == 1, report
    assert report["target_kills"][0].startswith("db killed by fault 00-after_decision-0")

    results = tmp_path / "results.jsonl"
    line = {"soak": {"seed": 5, "connectors": ["files"]}, "index": 0, "report": report}
    results.write_text(json.dumps(line) + "\n")
    tally = subprocess.run(
        [*common, "tally", str(results)], capture_output=True, text=True, timeout=60, check=True
    )
    assert "| 1 | 5 | files | 1 | 1 / 1 | 1 | **0** |" in tally.stdout
    assert "| db | 1 | 1 | 0 |" in tally.stdout
