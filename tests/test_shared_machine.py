"""A test session on a machine other sessions share (docs/testing.md, "Running two suites
on one machine"): the Spark CDS archive is built only when Spark runs, its lock cannot be
left held, a killed build leaves nothing behind, and each session has its own temp folder.

The archive's real build runs here only as far as its JVM's start (then it is killed):
the full build is what every ``./dev test`` does before its first Spark test.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from txsink.spark import cdsbuild as _cdsbuild
from txsink.spark import jvmcds as _jvmcds

ROOT = Path(__file__).resolve().parent.parent


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != _jvmcds.POLICY_ENV}
    env.update(TXSINK_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1", **extra)
    return env


def _built_anything(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []


@pytest.mark.parametrize(
    "args",
    [
        ["--collect-only", "-q", "tests/test_demo.py", "tests/test_files_spark.py"],
        ["--co", "-p", "no:cacheprovider", "-q", "tests/test_demo.py"],
        # a run that starts no Spark: tests that neither ask for `spark` nor are marked
        [
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_units.py::test_txnid_round_trips_and_rejects_bad_names",
        ],
    ],
    ids=["collect-only", "co-no-plugin", "run-without-spark"],
)
def test_no_archive_build_without_spark(tmp_path: Path, args: list[str]) -> None:
    cache = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=ROOT,
        env=_env(cache),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _built_anything(cache) == [], "the session built (or began) a CDS archive"


def test_the_session_lets_its_children_use_but_never_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.sharedmachine import SessionArchive

    calls: list[bool | None] = []
    monkeypatch.setattr(_jvmcds, "ensure_archive", lambda **kw: calls.append(kw.get("build")))
    monkeypatch.delenv(_jvmcds.POLICY_ENV, raising=False)
    archive = SessionArchive()
    assert os.environ[_jvmcds.POLICY_ENV] == "use" and _jvmcds.policy() == "use"
    archive.ensure()
    archive.ensure()
    assert calls == [True], "built once, by the session, whatever its children may do"

    monkeypatch.setenv(_jvmcds.POLICY_ENV, "0")
    calls.clear()
    SessionArchive().ensure()
    assert calls == [] and os.environ[_jvmcds.POLICY_ENV] == "0"


def test_use_never_builds_nor_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXSINK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(_jvmcds.POLICY_ENV, "use")
    monkeypatch.setattr(_cdsbuild, "build", lambda *a: pytest.fail("built under 'use'"))
    assert _jvmcds.ensure_archive() is None
    assert not (tmp_path / "cache").exists()


# -- the lock ---------------------------------------------------------------------------

_HOLD = """
import sys, time
from pathlib import Path
from txsink.spark.cdsbuild import build_lock
with build_lock(Path(sys.argv[1]) / "x.jsa", 0) as held:
    print("held" if held else "not held", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path / "cds")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_waiter_gives_up_naming_the_holder_then_takes_over_once_it_is_killed(
    tmp_path: Path, holder: subprocess.Popen[str], caplog: pytest.LogCaptureFixture
) -> None:
    archive = tmp_path / "cds" / "x.jsa"
    with caplog.at_level(logging.INFO, "txsink.cds"), _cdsbuild.build_lock(archive, 1) as held:
        assert not held
    gave_up = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(gave_up) == 1 and f"pid {holder.pid} (since " in gave_up[0], gave_up
    assert "TXSINK_SPARK_CDS=0" in gave_up[0]

    holder.send_signal(signal.SIGKILL)  # a killed holder: no unlock, no clean-up ran
    holder.wait()
    with _cdsbuild.build_lock(archive, 30.0) as held:
        assert held
        assert json.loads(Path(f"{archive}.lock").read_text())["pid"] == os.getpid()


# -- a build killed mid-way ---------------------------------------------------------------


def _pids_with(marker: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _wait(what: str, condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not callable(condition) or not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds processes in /proc")
def test_a_killed_build_leaves_nothing_after_the_next_run(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    builder = subprocess.Popen(
        [sys.executable, "-c", "from txsink.spark.jvmcds import ensure_archive; ensure_archive()"],
        env=_env(cache),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    work = f"build-{builder.pid}"
    try:
        # Kill the builder once its training run's JVM runs (the moment that used to leave
        # an orphaned JVM, a 180 MB temporary archive and a txsink-cds-* folder).
        _wait(
            "the build's JVM",
            lambda: any(
                b"ArchiveClassesAtExit" in Path(f"/proc/{p}/cmdline").read_bytes()
                for p in _pids_with(work)
            ),
            240,
        )
        builder.send_signal(signal.SIGKILL)
        builder.wait()
        # The training run dies with its builder, and its JVM with it (its stdin closes).
        _wait("the build's processes to end", lambda: not _pids_with(work), 120)
    finally:
        builder.kill()
        builder.wait()
        for pid in _pids_with(work):
            os.kill(pid, signal.SIGKILL)
    folder = _jvmcds_folder(cache)
    assert (folder / work).is_dir(), "nothing to clean: the test would prove nothing"
    # Its training query died with it: had the run outlived its builder, it would have
    # finished the query (two batches) before its JVM wrote the archive.
    assert not (folder / work / "query" / "checkpoint" / "commits" / "1").exists()
    assert not [p for p in os.listdir(tempfile.gettempdir()) if p.startswith("txsink-cds-")]

    # A process still running from a killed build (one whose JVM outlived it) is killed.
    stray = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", str(folder / work / "query")]
    )
    try:
        running = folder / f"build-{os.getpid()}"  # a build that runs (another archive's)
        running.mkdir()
        # (one that has run for a while: its command line is the new program's)
        _wait("the stray to run", lambda: stray.pid in _pids_with(str(folder / work)), 30)
        _cdsbuild.clean_orphans(folder)
        assert stray.wait(timeout=30) == -signal.SIGKILL
        assert running.is_dir(), "removed the folder of a build that still runs"
        running.rmdir()
    finally:
        stray.kill()
        stray.wait()
    assert [p.suffix for p in folder.iterdir()] == [".lock"]


def _jvmcds_folder(cache: Path) -> Path:
    found = [p for p in cache.glob("cds") if p.is_dir()]
    assert found, _built_anything(cache)
    return found[0]


# -- the session's own temporary folder ----------------------------------------------------


def test_the_session_has_its_own_temp_folder() -> None:
    mine = Path(tempfile.gettempdir())
    assert mine.name.startswith(f"txsink-session-{os.getpid()}-")
    assert os.environ["TMPDIR"] == str(mine)
    # pytest's tmp_path stays outside: a failed test's folders outlive the session.
    assert os.environ["PYTEST_DEBUG_TEMPROOT"] == str(mine.parent)


def test_a_killed_sessions_temp_folder_is_removed_by_the_next(tmp_path: Path) -> None:
    from tests.sharedmachine import SessionTemp

    dead = subprocess.Popen(["true"])
    dead.wait()
    system = Path(tempfile.gettempdir()).parent
    left = system / f"txsink-session-{dead.pid}-test"
    left.mkdir()
    (left / "txsink-faults-abc").mkdir()
    alive = system / f"txsink-session-{os.getpid()}-other"
    alive.mkdir()
    session = SessionTemp()
    saved = tempfile.tempdir
    tempfile.tempdir = str(system)
    try:
        made = session.install()
        assert made.parent == system and made.is_dir()
        assert not left.exists() and alive.exists()
    finally:
        session.remove()
        tempfile.tempdir = saved
        alive.rmdir()
    assert not made.exists()


def test_the_archive_cache_keeps_the_most_recently_used_within_its_cap(tmp_path: Path) -> None:
    """Every checkout's venv has an archive of its own (~180 MB): past the cap, the least
    recently used go with their lock files; the one just built stays even if alone over."""
    mb = 1024 * 1024
    archives = []
    for i in range(5):
        archive = tmp_path / f"spark-4.3.0-{i:016x}.jsa"
        archive.write_bytes(b"\0" * mb)
        Path(f"{archive}.lock").touch()
        os.utime(archive, (1000 + i, 1000 + i))  # archive 4 is the newest
        archives.append(archive)
    _cdsbuild.mark_used(archives[0])  # used now: the most recent of all
    removed = _cdsbuild.prune(tmp_path, keep=archives[1], max_mb=3)
    assert sorted(removed) == [archives[2]], removed  # 0, 4, 3 fit; 1 is kept; 2 goes
    assert not Path(f"{archives[2]}.lock").exists()
    assert all(a.exists() for a in archives if a != archives[2])
    removed = _cdsbuild.prune(tmp_path, keep=archives[1], max_mb=0)
    assert removed == [archives[0], archives[4], archives[3]], removed
    assert [a for a in archives if a.exists()] == [archives[1]]
