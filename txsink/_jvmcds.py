"""A JVM class-data-sharing (CDS) archive that halves a local Spark driver's start.

A local-mode driver spends most of its ~6 s start loading and verifying Spark's classes.
A *dynamic* CDS archive (JDK 13+: ``-XX:ArchiveClassesAtExit`` once, then
``-XX:SharedArchiveFile``) maps them in pre-parsed instead: measured on a 2-core VM with
JDK 17 and PySpark 4, the first job of a fresh process ran after 4.4 s instead of 9.3 s.
Chaos runs, the soak and the test suite start a new driver for every query run, so they
are what it is for.

The archive is only ever an optimisation:

- the JVM checks it against its own build and the class path, and silently runs without
  it on any mismatch (``-Xshare:auto``, CDS logging off);
- it is built by one throw-away child process that runs a tiny streaming query
  (``python -m txsink.localspark``) and exits cleanly, written under a temporary name
  and renamed only after that JVM exited with code 0, under a file lock: a crashed or
  concurrent build never leaves a torn archive;
- ``TXSINK_SPARK_CDS=0`` turns it off; the location is ``$TXSINK_CACHE_DIR`` (default
  ``$XDG_CACHE_HOME/txsink`` or ``~/.cache/txsink``), one file per Java and PySpark build.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["archive_path", "ensure_archive", "java_options"]

log = logging.getLogger("txsink.cds")

_DUMP_ENV = "TXSINK_SPARK_CDS_DUMP"
_QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def _enabled() -> bool:
    return os.environ.get("TXSINK_SPARK_CDS", "1") != "0"


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java").resolve())
    found = shutil.which("java")
    return str(Path(found).resolve()) if found else None


def archive_path() -> Path | None:
    """Where the archive for this Java and this PySpark lives (``None``: no Java found)."""
    java = _java()
    if java is None:
        return None
    try:
        import pyspark
    except ImportError:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    stat = Path(java).stat()
    key = hashlib.sha256(
        f"{java}|{stat.st_size}|{stat.st_mtime_ns}|{pyspark.__version__}|{jars}".encode()
    ).hexdigest()[:16]
    base = os.environ.get("TXSINK_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "txsink")
    )
    return Path(base, "cds", f"spark-{pyspark.__version__}-{key}.jsa")


def java_options() -> str:
    """Extra driver JVM options: use the archive if it exists, or dump it in a build."""
    dump = os.environ.get(_DUMP_ENV)
    if dump:
        return f"-XX:ArchiveClassesAtExit={dump} -Xlog:cds=off -Xlog:cds+dynamic=off"
    if not _enabled():
        return ""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {_QUIET}"


def ensure_archive(timeout: float = 300.0) -> Path | None:
    """Build the archive unless it exists; ``None`` when off, impossible or failed.

    Safe to call from many processes at once: one builds, the others wait on the lock and
    find it built. A failed build is logged at WARNING and costs only the slower start.
    """
    if not _enabled():
        return None
    path = archive_path()
    if path is None:
        return None
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with tempfile.TemporaryDirectory(prefix="txsink-cds-") as work:
            env = dict(os.environ, **{_DUMP_ENV: str(tmp)})
            env.setdefault("PYSPARK_PYTHON", sys.executable)
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "txsink.localspark", work],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                done = None
            if done is None or done.returncode != 0 or not tmp.is_file():
                tail = "" if done is None else (done.stdout + done.stderr)[-400:]
                log.warning("no Spark CDS archive (slower Spark starts): build failed %s", tail)
                tmp.unlink(missing_ok=True)
                return None
            os.replace(tmp, path)
    log.info("built the Spark CDS archive %s", path)
    return path
