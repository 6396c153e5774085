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
  (``python -m txsink.spark.localspark``) and exits cleanly, written under a temporary name
  and renamed only after that JVM exited with code 0, under a lock that dies with its
  holder; a killed build leaves no process, and its files are removed by the next build
  (:mod:`txsink.spark.cdsbuild`);
- ``TXSINK_SPARK_CDS`` says what a process may do: ``1`` (default) use the archive and
  build it where a command builds (``txsink chaos``, the test session), ``use`` use it
  when it exists but never build or wait for a build (what the test session gives the
  processes it starts, so their time limits never include a build), ``0`` off. The
  location is ``$TXSINK_CACHE_DIR`` (default ``$XDG_CACHE_HOME/txsink`` or
  ``~/.cache/txsink``), one file per Java and PySpark build. The archives there take at
  most ``TXSINK_CDS_CACHE_MB`` (default 2048) together: after a build, the least recently
  used go (:func:`txsink.spark.cdsbuild.prune`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from txsink.spark import cdsbuild as _cdsbuild

__all__ = ["archive_path", "ensure_archive", "java_options", "policy"]


_DUMP_ENV = "TXSINK_SPARK_CDS_DUMP"
_QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


POLICY_ENV = "TXSINK_SPARK_CDS"


def policy() -> Literal["build", "use", "off"]:
    """What ``TXSINK_SPARK_CDS`` allows this process: build, only use, or nothing."""
    value = os.environ.get(POLICY_ENV, "1").strip().lower()
    if value in {"0", "off", "false", "no"}:
        return "off"
    return "use" if value == "use" else "build"


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
        # The training run's TMPDIR is its build folder: Spark's scratch folders go there
        # too (java.io.tmpdir), so a killed build leaves them where the next one looks.
        scratch = tempfile.gettempdir()
        return (
            f"-XX:ArchiveClassesAtExit={dump} -Xlog:cds=off -Xlog:cds+dynamic=off "
            f"-Djava.io.tmpdir={scratch}"
        )
    if policy() == "off":
        return ""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {_QUIET}"


def ensure_archive(
    timeout: float = 300.0, *, wait_s: float | None = None, build: bool | None = None
) -> Path | None:
    """Build the archive unless it exists; ``None`` when off, impossible or failed.

    ``build`` overrides what :func:`policy` allows (the test session builds while its
    children only use). Safe to call from many processes and checkouts at once: one
    builds, the others wait for at most ``wait_s`` (default: ``timeout``, the most a build
    takes) and find it built, or go on without it. A failed build is logged at WARNING and
    costs only the slower start.
    """
    allowed = policy()
    if allowed == "off":
        return None
    path = archive_path()
    if path is None:
        return None
    if path.is_file():
        _cdsbuild.mark_used(path)
        return path
    if not (allowed == "build" if build is None else build):
        return None
    with _cdsbuild.build_lock(path, timeout if wait_s is None else wait_s) as held:
        if not held:
            return None
        if path.is_file():
            return path
        _cdsbuild.clean_orphans(path.parent)
        built = _cdsbuild.build(path, timeout)
        if built is not None:
            _cdsbuild.prune(path.parent, keep=built)
        return built
