"""What keeps a test session to itself on a machine other sessions share (docs/testing.md,
"Running two suites on one machine"): its own temporary folder, and the Spark CDS
archive built only when a test starts Spark, by the session alone.

- **Its own temporary folder.** The session sets ``TMPDIR`` (and :mod:`tempfile`'s cache)
  to ``<system temp>/txsink-session-<pid>-<random>/`` before any test runs, so what txsink
  and the tests' child processes put in "the temporary folder" (fault-plan state, docs
  runs, staging folders) is this session's alone: the leak check
  (``integration/leaks.py``) counts only what this session made, and two sessions running
  the same fault plan do not share its state. pytest's own ``tmp_path`` root stays where
  it was (``PYTEST_DEBUG_TEMPROOT``), so a failed test's folders are kept as usual. The
  folder is removed when the session ends; a killed session's is removed by the next
  session (the pid in its name is gone).
- **The CDS archive** (:mod:`txsink.spark.jvmcds`, ~45 s to build on an idle 2-core machine)
  is built before the first test marked ``spark`` (any test that asks for the ``spark``
  fixture is marked), never for a collection (``--collect-only``) nor for a run that
  starts no Spark. The processes the tests start get ``TXSINK_SPARK_CDS=use``: they use
  the archive, but never build it or wait for another build, so a test's time limit
  never includes one.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from txsink.kit.process import process_alive

__all__ = ["SessionArchive", "SessionTemp"]

_PREFIX = "txsink-session-"
_NAME = re.compile(rf"^{_PREFIX}(\d+)-")


class SessionTemp:
    """The session's own temporary folder (``install`` at configure, ``remove`` at the end)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._saved: dict[str, str | None] = {}

    def install(self) -> Path:
        system = Path(tempfile.gettempdir())
        _remove_dead_sessions(system)
        self.path = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=system))
        for key in ("TMPDIR", "PYTEST_DEBUG_TEMPROOT"):
            self._saved[key] = os.environ.get(key)
        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(system))
        os.environ["TMPDIR"] = str(self.path)
        tempfile.tempdir = str(self.path)
        return self.path

    def remove(self) -> None:
        if self.path is None:
            return
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        tempfile.tempdir = None
        shutil.rmtree(self.path, ignore_errors=True)
        self.path = None


def _remove_dead_sessions(system: Path) -> None:
    """Remove the folders of sessions that were killed (their pid runs no more)."""
    with contextlib.suppress(OSError):
        for entry in system.iterdir():
            m = _NAME.match(entry.name)
            if m is not None and not process_alive(int(m.group(1))):
                shutil.rmtree(entry, ignore_errors=True)


class SessionArchive:
    """The CDS archive, built at most once per session and only when a test needs Spark."""

    def __init__(self) -> None:
        from txsink.spark import jvmcds as _jvmcds

        # The user's choice decides for the session; its children only ever use.
        self.build = _jvmcds.policy() == "build"
        if self.build:
            os.environ[_jvmcds.POLICY_ENV] = "use"
        self.done = False

    def ensure(self) -> None:
        if self.done:
            return
        self.done = True
        if self.build:
            from txsink.spark.jvmcds import ensure_archive

            ensure_archive(build=True)
