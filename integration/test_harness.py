"""The services harness itself: shared caches are built once under a lock, a restarted
server keeps its port, and under ``CI=true`` nothing stands in for a real server.

No server is started here: these check the harness's own decisions, with the build step
replaced by a stand-in (the real builds are exercised by every ``integration/services up``).
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest
from _services import common, s3
from _services.common import ServiceError, StartReport, cache_lock, choose_port, free_port


def _build_once(cache: str, out: str, hold_s: float) -> None:
    """What every builder does: under the cache lock, reuse a finished result or build it."""
    import os

    os.environ["TXSINK_SERVICES_CACHE"] = cache
    result = Path(cache) / "thing" / "bin"
    with cache_lock("thing"):
        if result.exists():
            return
        with open(out, "a") as fh:  # one line per build that really ran
            fh.write(f"{os.getpid()}\n")
        result.parent.mkdir(parents=True, exist_ok=True)
        time.sleep(hold_s)  # a build takes a while: the other caller must wait, not race
        result.write_text("built")


def test_two_cold_builds_at_once_build_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = tmp_path / "builds.txt"
    procs = [
        ctx.Process(target=_build_once, args=(str(tmp_path / "cache"), str(out), 1.0))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(out.read_text().split()) == 1, "the second caller built again instead of waiting"
    assert (tmp_path / "cache" / "thing" / "bin").read_text() == "built"


def test_a_restarted_server_keeps_its_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXSINK_SERVICES_CACHE", str(tmp_path))  # its claims: not the machine's
    previous, default = free_port(), free_port()
    assert choose_port(default, previous, set()) == previous
    # No previous run: the documented default.
    assert choose_port(default, None, set()) == default
    # The previous port is taken by someone else now: the default, and never a taken one.
    assert choose_port(default, previous, {previous}) == default


def test_under_ci_a_failed_minio_build_is_an_error_not_moto(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_build(report: StartReport) -> Path:
        raise ServiceError("go build failed (stand-in)")

    started: list[str] = []
    monkeypatch.setattr(s3, "build_minio", no_build)
    monkeypatch.setattr(s3.S3, "_start_moto", lambda self, state: started.append("moto"))
    monkeypatch.setattr(s3.S3, "assign_ports", lambda self, state, taken, report: None)
    monkeypatch.delenv("TXSINK_S3_SERVER", raising=False)
    state: dict[str, Any] = {}

    monkeypatch.setenv("CI", "true")
    assert common.real_servers_required()
    with pytest.raises(ServiceError, match="CI=true"):
        s3.S3().start(state, set(), StartReport("s3", {}))
    assert started == []

    # Outside CI the documented fallback still serves a developer without Go.
    monkeypatch.delenv("CI")
    report = StartReport("s3", {})
    s3.S3().start(state, set(), report)
    assert started == ["moto"] and "MinIO build failed, moto fallback" in report.notes
