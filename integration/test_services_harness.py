"""The service harness cleans up after itself: ``integration/services down --purge`` removes
everything ``up`` made.

The test starts a second, separate set of servers in a work folder of its own
(``TXSINK_SERVICES_WORK``: own ports, own data, own env file), exactly as ``up`` does from
another checkout, and purges it; the servers the rest of the suite uses are never touched.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "integration" / "services"
CHECKOUT_ENV = ROOT / "integration" / ".services.env"
OUTSIDE = Path("/var/lib/txsink-services")  # PostgreSQL's cluster, when we are root


def _services(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TXSINK_SERVICES_WORK": str(work)}
    return subprocess.run(
        [str(SERVICES), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )


def _listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


@pytest.mark.timeout(900)
def test_down_purge_leaves_nothing_behind(tmp_path: Path) -> None:
    work = tmp_path / "work"
    checkout_env = CHECKOUT_ENV.read_bytes() if CHECKOUT_ENV.exists() else None
    outside_before = _listing(OUTSIDE)

    up = _services(work, "up")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        made = {p.name for p in work.iterdir()}
        assert {"postgres", "kafka", "s3", "registry", "postgres_stock"} <= made
        assert {"logs", "pids", "services.env"} <= made
        # Its own env file: the checkout's (the suite's servers) is not replaced.
        assert (CHECKOUT_ENV.read_bytes() if CHECKOUT_ENV.exists() else None) == checkout_env
    finally:
        down = _services(work, "down", "--purge")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "postgres, kafka, s3, registry, postgres_stock" in down.stdout

    assert not work.exists(), sorted(str(p) for p in work.rglob("*"))
    assert _listing(OUTSIDE) <= outside_before  # no cluster folder left under /var/lib
    assert (CHECKOUT_ENV.read_bytes() if CHECKOUT_ENV.exists() else None) == checkout_env
