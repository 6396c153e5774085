"""Building the Spark CDS archive safely on a machine shared by many runs and checkouts.

:mod:`txsink.spark.jvmcds` decides *whether* to build; this module does the build so that no
run can leave anything behind for another to trip over:

1. **The lock dies with its holder, and is the archive's own.** One ``flock`` on
   ``<archive>.lock`` (released by the kernel when the holding process ends, however it
   ends): checkouts with their own venvs have archives of their own and build them side by
   side; only runs that want the same archive wait for each other. Its *content* (holder
   pid, start time, command) is only for the message of a waiter; nothing trusts it. A
   waiter polls for at most its own bound, then goes on without the archive and says whose
   build it gave up on.
2. **A killed build leaves no process running.** The training run
   (``python -m txsink.spark.localspark``) starts in a session of its own and asks the kernel to
   SIGKILL it when the builder dies (``PR_SET_PDEATHSIG``, :func:`die_with_builder`); its
   Spark JVM exits when the training run's end closes its stdin. Whatever still runs after
   a failed build (a timeout, an interrupt), or after a killed builder whose JVM was still
   writing, is found by the build's folder on its command line (:func:`kill_leftovers`)
   and killed.
3. **A killed build leaves no files for long.** Everything a build writes carries the
   builder's pid: ``build-<pid>/`` (the query's input and checkpoint, and the training
   run's ``TMPDIR`` and ``java.io.tmpdir``, so Spark's own scratch folders too) and the
   archive's temporary ``<name>.<pid>.tmp`` (about 180 MB), both beside the archive, never
   in a temp folder another run's leak check looks at. The next build removes those whose
   builder no longer runs (:func:`clean_orphans`), after killing what still runs of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from txsink.kit.process import process_alive

__all__ = [
    "BUILDER_ENV",
    "build",
    "build_lock",
    "clean_orphans",
    "die_with_builder",
    "kill_leftovers",
]

log = logging.getLogger("txsink.cds")

#: The builder's pid, given to the training run so it can die with the builder.
BUILDER_ENV = "TXSINK_SPARK_CDS_BUILDER"
_LEFTOVER = re.compile(r"^(?:build-(\d+)|.+\.jsa\.(\d+)\.tmp)$")
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5


@contextlib.contextmanager
def build_lock(archive: Path, wait_s: float) -> Iterator[bool]:
    """Hold the build lock of ``archive`` (yields True), or give up after ``wait_s`` (False).

    A killed holder cannot keep it: ``flock`` locks belong to the open file, which the
    kernel closes when the process ends. While waiting, the holder named in the lock file
    is logged once (INFO), and again with the way out when the wait gives up (WARNING).
    """
    archive.parent.mkdir(parents=True, exist_ok=True)
    # "a+": opening must not empty the file before the lock is held (its content is the
    # holder's description, read by waiters).
    lock = archive.with_name(f"{archive.name}.lock")
    with open(lock, "a+") as fh:
        deadline = time.monotonic() + max(wait_s, 0.0)
        told = False
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(lock)
                if time.monotonic() >= deadline:
                    log.warning(
                        "gave up after %.0f s waiting for the Spark CDS archive that %s is "
                        "building; Spark starts without it (about 5 s slower each). The "
                        "build ends within its own time limit or with its process; "
                        "TXSINK_SPARK_CDS=0 turns the archive off",
                        wait_s,
                        holder,
                    )
                    yield False
                    return
                if not told:
                    log.info(
                        "waiting (at most %.0f s) for %s to build the Spark CDS archive",
                        wait_s,
                        holder,
                    )
                    told = True
                time.sleep(_POLL_S)
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps({"pid": os.getpid(), "since": time.time(), "argv": sys.argv}))
            fh.flush()
            yield True
        finally:
            with contextlib.suppress(OSError):
                fh.truncate(0)
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _holder(lock: Path) -> str:
    """The lock holder as the lock file describes it (for a message only)."""
    try:
        info = json.loads(lock.read_text(encoding="utf-8") or "{}")
        pid = int(info["pid"])
        since = time.strftime("%H:%M:%S", time.localtime(float(info["since"])))
        argv = " ".join(str(a) for a in info.get("argv", []))[:120]
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"
    if not process_alive(pid):
        return f"a process that inherited the lock of pid {pid} (gone)"
    return f"pid {pid} (since {since}: {argv})"


def clean_orphans(folder: Path) -> list[Path]:
    """Remove what killed builds left in ``folder``: for each ``build-<pid>/`` folder and
    temporary archive whose builder ``pid`` runs no more, kill the processes still running
    from it, then delete it. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = _LEFTOVER.match(entry.name)
        if m is None or process_alive(int(m.group(1) or m.group(2))):
            continue  # not a build's, or its builder (perhaps this process) still runs
        killed = kill_leftovers(str(entry))
        if killed:
            log.info("killed %d process(es) left by a killed CDS build: %s", len(killed), killed)
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    if removed:
        log.info("removed what killed Spark CDS builds left: %s", [p.name for p in removed])
    return removed


#: The most the archives in one cache folder may take together (``TXSINK_CDS_CACHE_MB``);
#: one archive is ~130-185 MB, and each checkout's venv has its own (its jars' path is in
#: the key), so without a cap a machine that clones often fills its disk.
CACHE_MB = 2048
#: A used archive's mtime is moved at most this often (it marks it recently used).
TOUCH_EVERY_S = 3600.0


def mark_used(archive: Path) -> None:
    """Mark ``archive`` as recently used (its mtime), so :func:`prune` keeps it. At most once
    an hour: every Spark start calls this."""
    with contextlib.suppress(OSError):
        if time.time() - archive.stat().st_mtime > TOUCH_EVERY_S:
            os.utime(archive)


def prune(folder: Path, keep: Path, max_mb: int | None = None) -> list[Path]:
    """Delete the least recently used archives of ``folder`` (and their lock files) until
    the rest fit in ``max_mb`` (default ``TXSINK_CDS_CACHE_MB`` or :data:`CACHE_MB`); never
    ``keep``, the one just built. A JVM that has an archive mapped keeps reading it after
    the delete (Linux keeps the inode); the next start in that checkout builds it again.
    Returns what was deleted."""
    limit = max_mb if max_mb is not None else int(os.environ.get("TXSINK_CDS_CACHE_MB", CACHE_MB))
    try:
        archives = [(p.stat().st_mtime, p.stat().st_size, p) for p in folder.glob("*.jsa")]
    except OSError:
        return []
    archives.sort(reverse=True)  # newest first
    total, removed = 0, []
    for _, size, path in archives:
        total += size
        if path == keep or total <= limit * 1024 * 1024:
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            Path(f"{path}.lock").unlink(missing_ok=True)
            removed.append(path)
            total -= size
    if removed:
        log.info(
            "removed %d least recently used Spark CDS archive(s) over the %d MB cap: %s",
            len(removed),
            limit,
            [p.name for p in removed],
        )
    return removed


def kill_leftovers(marker: str) -> list[int]:
    """SIGKILL every process of this user whose command line contains ``marker`` (a build's
    folder or temporary archive: unique to one build, so nothing else matches); returns
    their pids. Empty without ``/proc``."""
    killed: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return killed
    needle = marker.encode()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "cmdline").read_bytes():
                continue
            os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours
        killed.append(int(entry.name))
    return killed


def build(path: Path, timeout: float) -> Path | None:
    """Run the training query once and move its archive to ``path`` (call with the
    archive's lock held); ``None`` when it failed (logged at WARNING: only the slower start
    is lost)."""
    me = os.getpid()
    work = path.parent / f"build-{me}"
    tmp = path.with_name(f"{path.name}.{me}.tmp")
    shutil.rmtree(work, ignore_errors=True)
    (work / "tmp").mkdir(parents=True)
    env = dict(os.environ)
    env.update(
        {
            "TXSINK_SPARK_CDS_DUMP": str(tmp),
            BUILDER_ENV: str(me),
            "TMPDIR": str(work / "tmp"),
        }
    )
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    output = work / "build.log"
    rc: int | None = None
    try:
        with open(output, "wb") as out:
            child = subprocess.Popen(
                [sys.executable, "-m", "txsink.spark.localspark", str(work / "query")],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc = child.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the Spark CDS archive build took more than %.0f s: stopped", timeout)
            finally:
                if child.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
        if rc != 0 or not tmp.is_file():
            kill_leftovers(str(work))  # a JVM whose training run crashed
            tail = output.read_text(errors="replace")[-400:] if output.is_file() else ""
            log.warning("no Spark CDS archive (slower Spark starts): build failed %s", tail)
            return None
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    log.info("built the Spark CDS archive %s", path)
    return path


def die_with_builder() -> None:
    """In the training run: be SIGKILLed by the kernel when the builder dies, and exit now
    if it already has (no builder named: nothing to do). Linux only; elsewhere the next
    build's :func:`clean_orphans` is what stops a leftover."""
    expected = os.environ.get(BUILDER_ENV)
    if not expected or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != int(expected):  # the builder died before prctl took effect
        raise SystemExit(3)
