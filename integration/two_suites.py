"""Two test suites on one machine at once, each from its own checkout with its own servers.

    python integration/two_suites.py [--second DIR] [--cache DIR] [--services ...] [TESTS...]

What ``./dev test`` does in two clones at the same moment, made small: in each checkout,
at the same time, ``integration/services up`` (its own servers and ports), pytest over
``TESTS`` pointed at those servers, then ``integration/services down --purge``. Both
must pass. It is the check of docs/testing.md's "Running two suites on one machine":
ports (the Kafka proxy's included) chosen apart, the build caches' locks, the CDS
archive's lock, each session's own temporary folder and leak check.

The second checkout is ``--second DIR`` (a clone with its own ``.venv``), or by default a
fresh ``git clone`` of this checkout's HEAD in a temporary folder, run with this
checkout's venv and the clone first on ``PYTHONPATH`` (its own code; removed at the end).
``--cache DIR`` gives both suites one empty ``TXSINK_CACHE_DIR``: both reach the CDS
archive build at once, so one builds while the other waits for it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = [
    "tests/test_demo.py",
    "integration/test_harness.py",
    "integration/test_services_smoke.py",
    "integration/test_shared_machine.py",
]


@dataclass
class Run:
    name: str
    checkout: Path
    env: dict[str, str]
    steps: list[tuple[str, int, float, str]] = field(default_factory=list)

    def step(self, what: str, argv: list[str], env: dict[str, str], timeout: float) -> int:
        t0 = time.monotonic()
        done = subprocess.run(
            argv,
            cwd=self.checkout,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        out = done.stdout + done.stderr
        (self.checkout / f".two-suites-{what}.log").write_text(out)
        tail = [line for line in out.splitlines() if line.strip()][-1:] or [""]
        self.steps.append((what, done.returncode, time.monotonic() - t0, tail[0][:110]))
        return done.returncode


def _services_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                env[key] = value.strip("'")
    return env


def suite(run: Run, services: list[str], tests: list[str], pytest_args: list[str]) -> None:
    """One checkout's ``./dev test``, small: up, pytest, down --purge (always)."""
    wrapper = str(run.checkout / "integration" / "services")
    try:
        if run.step("up", [wrapper, "up", *services], run.env, 1800) != 0:
            return
        env = dict(run.env, **_services_env(run.checkout / "integration" / ".services.env"))
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
        run.step("pytest", [*argv, *tests], env, 3600)
    finally:
        run.step("down", [wrapper, "down", "--purge"], run.env, 600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", nargs="*", default=TESTS)
    parser.add_argument("--second", type=Path, help="a second checkout with its own .venv")
    parser.add_argument("--cache", type=Path, help="one TXSINK_CACHE_DIR for both (empty)")
    parser.add_argument("--services", nargs="*", default=[], help="default: all four")
    parser.add_argument("--pytest-args", default="", help="extra pytest options")
    args = parser.parse_args()

    base = {k: v for k, v in os.environ.items() if not k.startswith("TXSINK_")}
    base.pop("PYTHONPATH", None)
    if args.cache:
        base["TXSINK_CACHE_DIR"] = str(args.cache)
    made: Path | None = None
    second_env = dict(base)
    if args.second is not None:
        second = args.second.resolve()
        venv = second / ".venv" / "bin"
        second_env.update(
            PATH=f"{venv}:{base['PATH']}",
            PYSPARK_PYTHON=str(venv / "python"),
            PYSPARK_DRIVER_PYTHON=str(venv / "python"),
        )
    else:
        made = Path(tempfile.mkdtemp(prefix="two-suites-"))
        second = made / "second"
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        subprocess.run(
            ["git", "clone", "-q", "--shared", "--no-checkout", str(ROOT), str(second)], check=True
        )
        subprocess.run(["git", "-C", str(second), "checkout", "-q", head], check=True)
        second_env["PYTHONPATH"] = str(second)
    runs = [Run("first", ROOT, base), Run("second", second, second_env)]
    threads = [
        threading.Thread(
            target=suite, args=(r, args.services, args.tests, args.pytest_args.split())
        )
        for r in runs
    ]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    ok = True
    for r in runs:
        print(f"{r.name}: {r.checkout}")
        for what, rc, seconds, tail in r.steps:
            ok &= rc == 0
            print(f"  {what:7s} exit {rc:3d} {seconds:7.1f} s  {tail}")
        ok &= [s[0] for s in r.steps] == ["up", "pytest", "down"]
    print(
        f"both at once: {wall:.0f} s wall; {'both passed' if ok else 'FAILED'}"
        f" (logs: <checkout>/.two-suites-*.log)"
    )
    if made is not None and ok:
        shutil.rmtree(made, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
