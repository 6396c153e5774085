"""The chaos toolkit (``txsink.testing``): plans, verdicts, the pytest plugin, the CLI.

Fast tests use tiny pure-Python pipelines (no Spark); one soak runs three random plans of
``raise``/``kill-driver`` faults through real Spark queries (about 2 min on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txsink.connectors.files.testing import FilesVerifier
from txsink.protocol.faults import TASK_POINTS, CrashPoint, FaultMode, FaultPlan
from txsink.testing import (
    ChaosPlan,
    IdsVerifier,
    SinkVerifier,
    run_chaos,
    verify,
)

pytestmark = pytest.mark.chaos

# -- plans --------------------------------------------------------------------------------


def test_random_plan_is_reproducible_and_valid() -> None:
    a = ChaosPlan.random(42, epochs=6, partitions=3, n=4)
    b = ChaosPlan.random(42, epochs=6, partitions=3, n=4)
    assert a.spec == b.spec and a.seed == 42
    assert len({ChaosPlan.random(s, epochs=6, partitions=3, n=4).spec for s in range(20)}) > 10
    for seed in range(200):
        plan = ChaosPlan.random(
            seed, epochs=4, partitions=2, n=3, modes=list(FaultMode), targets=["pg", "s3"]
        )
        parsed = FaultPlan.parse(plan.spec, "/nonexistent")  # a valid txsink.protocol.faults spec
        assert parsed.faults == plan.faults
        for i, fault in enumerate(plan.faults):
            if fault.mode is FaultMode.KILL_WORKER or fault.partition is not None:
                assert fault.point in TASK_POINTS
            if fault.point is CrashPoint.DURING_RECOVERY:  # recovery gets work to do
                lead = plan.faults[i - 1]
                assert (lead.point, lead.epoch) == (CrashPoint.DURING_COMMIT, fault.epoch)
        epochs = [f.epoch for f in plan.faults if f.point is not CrashPoint.DURING_COMMIT]
        assert len(epochs) == len(set(epochs))  # at most one fault per epoch (plus leads)


def test_probability_is_decided_at_creation() -> None:
    assert ChaosPlan.random(1, epochs=5, n=5, probability=0.0).faults == ()
    half = [ChaosPlan.random(s, epochs=5, n=5, probability=0.5).spec for s in range(5)]
    assert half == [ChaosPlan.random(s, epochs=5, n=5, probability=0.5).spec for s in range(5)]
    full = ChaosPlan.of("after_decision:kill-driver@0", "during_commit@1", "before_decision@2")
    assert full.sample(1.0, seed=3).faults == full.faults
    assert full.sample(0.5, seed=3) == full.sample(0.5, seed=3)
    with pytest.raises(ValueError, match="probability"):
        ChaosPlan.random(1, epochs=2, probability=1.5)
    with pytest.raises(ValueError, match="kill-worker"):
        ChaosPlan.parse("after_decision:kill-worker")


# -- verdicts: a verifier that cannot fail is no verifier ---------------------------------


def test_verdict_fails_on_duplicates_missing_and_lingering() -> None:
    assert verify(IdsVerifier(range(4), [0, 1, 2, 3])).ok
    dup = verify(IdsVerifier(range(4), [0, 1, 1, 2, 3]))
    assert not dup.ok and dup.duplicates == 1
    lost = verify(IdsVerifier(range(4), lambda: [0, 1, 3]))
    assert not lost.ok and lost.missing == 1
    left = verify(IdsVerifier(range(2), [0, 1], lingering_count=lambda: 2))
    assert not left.ok and left.lingering == 2
    assert isinstance(IdsVerifier(range(1), [0]), SinkVerifier)


def _files_output(root: Path, manifests: dict[int, list[str]]) -> None:
    """A files-sink folder by hand: epoch e's file holds ids 10e..10e+9."""
    (root / "_manifests").mkdir(parents=True)
    for epoch, paths in manifests.items():
        for rel in paths:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            first = int(rel.split("=")[1].split("/")[0]) * 10
            pq.write_table(
                pa.table({"id": pa.array(range(first, first + 10), pa.int64())}), root / rel
            )
        doc = {
            "uid": "out",
            "epoch": epoch,
            "format": "parquet",
            "files": [{"path": p} for p in paths],
        }
        (root / "_manifests" / f"out-{epoch:020d}.json").write_text(json.dumps(doc))


def test_files_verifier_catches_corrupted_output(tmp_path: Path) -> None:
    good = tmp_path / "good"
    _files_output(
        good, {0: ["epoch=0/out-p00000-0000.parquet"], 1: ["epoch=1/out-p00000-0000.parquet"]}
    )
    verdict = verify(FilesVerifier(good, range(20), uid="out"))
    assert verdict.ok and verdict.epochs == 2 and verdict.rows_written == 20

    bad = tmp_path / "bad"  # epoch 1 names epoch 0's file again: duplicates and missing ids
    _files_output(
        bad, {0: ["epoch=0/out-p00000-0000.parquet"], 1: ["epoch=0/out-p00000-0000.parquet"]}
    )
    verdict = verify(FilesVerifier(bad, range(20), uid="out"))
    assert not verdict.ok and (verdict.duplicates, verdict.missing) == (10, 10)

    (good / "_txsink" / "staging" / "txsink.app.out.e2.r0.p0.a0").mkdir(parents=True)
    (good / "epoch=2").mkdir()
    (good / "epoch=2" / "out-p00000-0000.parquet").write_bytes(b"published, no manifest")
    verdict = verify(FilesVerifier(good, range(20), uid="out"))
    assert not verdict.ok and verdict.lingering == 2 and verdict.duplicates == 0


# -- run_chaos with a tiny pipeline (no Spark) --------------------------------------------

TINY = textwrap.dedent(
    """
    import json, os

    def run(out, ids, crashes=0, dup=False):
        # crash the first `crashes` runs (a stand-in for a killed driver), then write
        count = out + ".runs"
        runs = int(open(count).read()) if os.path.exists(count) else 0
        open(count, "w").write(str(runs + 1))
        if runs < crashes:
            print("txsink: tiny pipeline crashing", flush=True)
            os._exit(3)
        json.dump(list(ids) + ([ids[0]] if dup else []), open(out, "w"))
    """
)


def _read(out: Path) -> list[int]:
    return list(json.loads(out.read_text())) if out.exists() else []


def test_run_chaos_counts_restarts_and_fails_a_bad_sink(tmp_path: Path) -> None:
    pipeline = tmp_path / "tiny.py"
    pipeline.write_text(TINY)
    out = tmp_path / "out.json"
    lines: list[str] = []
    report = run_chaos(
        f"{pipeline}:run",
        ChaosPlan.none(),
        workdir=tmp_path / "w",
        args={"out": str(out), "ids": list(range(5)), "crashes": 2},
        sinks_verifiers={"tiny": IdsVerifier(range(5), lambda: _read(out))},
        on_progress=lines.append,
    )
    assert report.ok and report.finished and report.restarts == 2, report.table()
    assert report.exit_codes == [3, 3, 0]
    assert any("restarting" in line for line in lines)
    assert "tiny" in report.table() and json.loads(json.dumps(report.as_dict()))["ok"]

    out.unlink()
    Path(str(out) + ".runs").unlink()
    bad = run_chaos(
        f"{pipeline}:run",
        "",
        workdir=tmp_path / "w",
        args={"out": str(out), "ids": list(range(5)), "dup": True},
        sinks_verifiers={"tiny": IdsVerifier(range(5), lambda: _read(out))},
    )
    assert not bad.ok and bad.violations == 1 and bad.verdicts["tiny"].duplicates == 1
    with pytest.raises(AssertionError, match="exactly-once"):
        bad.assert_ok()


# -- the pytest plugin, as a user's project loads it (entry point) -------------------------


def test_pytest_plugin_fixtures_in_a_user_project(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(TINY)
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import json
            from pathlib import Path
            from txsink.testing import ChaosPlan, IdsVerifier

            HERE = Path(__file__).parent

            def _verifier(out):
                return IdsVerifier(range(3), lambda: json.loads(out.read_text()))

            def test_good(chaos_runner, chaos_workdir, chaos_seed, request):
                assert chaos_seed == 5 and chaos_workdir.is_dir()
                assert request.node.get_closest_marker("chaos") is not None
                out = chaos_workdir / "out.json"
                report = chaos_runner(
                    f"{HERE / 'tiny.py'}:run",
                    ChaosPlan.none(),
                    args={"out": str(out), "ids": [0, 1, 2], "crashes": 1},
                    sinks_verifiers={"tiny": _verifier(out)},
                )
                assert report.restarts == 1 and chaos_runner.reports == [report]

            def test_duplicate_fails(chaos_runner, chaos_workdir):
                out = chaos_workdir / "out.json"
                chaos_runner(
                    f"{HERE / 'tiny.py'}:run",
                    "",
                    args={"out": str(out), "ids": [0, 1, 2], "dup": True},
                    sinks_verifiers={"tiny": _verifier(out)},
                )
            """
        )
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--chaos-seed",
            "5",
            "-m",
            "chaos",
            "test_user.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "1 passed" in proc.stdout and "1 failed" in proc.stdout, proc.stdout[-3000:]
    assert "chaos run failed the exactly-once check" in proc.stdout
    assert "FAIL" in proc.stdout


def test_cli_chaos_run_with_user_verifiers(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(TINY)
    (tmp_path / "checks.py").write_text(
        "import json\nfrom txsink.testing import IdsVerifier\n"
        "def make(args):\n"
        "    return {'tiny': IdsVerifier(args['ids'], lambda: json.load(open(args['out'])))}\n"
    )
    args = {"out": str(tmp_path / "out.json"), "ids": [0, 1, 2, 3], "crashes": 1}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "txsink.cli",
            "chaos",
            "run",
            "--pipeline",
            f"{tmp_path / 'tiny.py'}:run",
            "--args",
            json.dumps(args),
            "--verifiers",
            f"{tmp_path / 'checks.py'}:make",
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
    assert report["ok"] and report["restarts"] == 1 and report["sinks"]["tiny"]["rows_written"] == 4
    assert "restarting" in proc.stderr

    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "txsink.cli",
            "chaos",
            "run",
            "--pipeline",
            "x.py:f",
            "--plan",
            "after_decision:kill-worker",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "kill-worker" in bad.stderr


# -- the soak: real Spark queries, random raise / kill-driver plans, files connector --------


@pytest.mark.parametrize(
    "plans",
    [
        # The default: seed 6's first plan alone, the driver killed at a task point (two
        # query runs): the soak's plan, run, restart and verdict end to end.
        pytest.param(1, id="one-plan"),
        # With --run-slow: its second plan too, a raise at a driver point (four runs); the
        # default suite raises at every driver point in integration/test_matrix.py.
        pytest.param(2, id="two-plans", marks=pytest.mark.slow),
    ],
)
def test_small_soak_has_no_violations(tmp_path: Path, plans: int) -> None:
    """``txsink chaos soak``: random plans (seed 6: the driver killed at a task point, then
    a raise at a driver point; two query runs each) on a 3-epoch input; every plan
    exactly-once. (Seed 3's three plans raised twice at a task point: six runs, nothing
    more covered.)"""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "txsink.cli",
            "chaos",
            "soak",
            "--plans",
            str(plans),
            "--seed",
            "6",
            "--connectors",
            "files",
            "--epochs",
            "3",
            "--rows",
            "300",
            "--workdir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "TXSINK_FAULT": ""},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    tallies = [line for line in lines if line.startswith("[") and not line.startswith("[{")]
    assert len(tallies) == plans and tallies[-1].startswith(f"[{plans}/{plans}]"), proc.stdout
    reports = json.loads(lines[-1])
    assert [r["plan"] for r in reports] == [
        ChaosPlan.random(s, 3, 2).spec for s in _soak_seeds(6, plans)
    ]
    kinds = [spec.split(":")[1].split("@")[0] for spec in (r["plan"] for r in reports)]
    assert kinds == ["kill-driver", "raise"][:plans], reports
    for r in reports:
        assert r["ok"] and r["finished"], r
        assert r["faults_fired"] == r["faults_planned"] >= 1, r
        assert r["restarts"] == r["faults_planned"], r  # local mode: every fault ends a run
        assert all(s is not None and s > 0 for s in r["recovery_seconds"]), r
        files = r["sinks"]["files"]
        assert (files["rows_written"], files["duplicates"], files["missing"]) == (300, 0, 0)
        assert files["lingering"] == 0 and files["epochs"] == 3
        # and txsink audit --deep of the plan's epochs, at the end of the plan
        assert r["audit"].startswith("audit (deep (rows read)) of epochs 0-2 x 1 sink(s)"), r
        assert r["audit"].endswith("every epoch matches"), r
    assert "0 violation(s)" in lines[-2] and "recovery median" in lines[-2]


def _soak_seeds(seed: int, plans: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(2**31) for _ in range(plans)]


def test_a_soak_draws_single_pass_variants_for_some_plans() -> None:
    """Half the plans, by the plan's seed, run a connector's single-pass variant (Kafka's
    direct mode) instead of its default: the soak covers single-pass epochs too."""
    from txsink.testing.chaos.soak import _draw_variants

    drawn = [_draw_variants(["kafka", "files"], seed) for seed in range(40)]
    assert drawn == [_draw_variants(["kafka", "files"], seed) for seed in range(40)]
    direct = [d for d in drawn if d.get("kafka", {}).get("mode") == "direct"]
    assert 5 < len(direct) < 35
    assert all(set(d) <= {"kafka"} for d in drawn)  # files has no single-pass variant
