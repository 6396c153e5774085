"""Leak checks after every integration test: what a test opened, it must close.

Flink checks after every test that no Kafka producer outlived it; txsink's integration
tests are checked the same way, for everything of the test process (``/proc/self``) that
a sink, a verifier or a fixture can leave open:

- **threads**: a new non-daemon thread (it would keep the process alive), or any new
  thread whose name says ``txsink`` (a pool of txsink's that was not shut down);
- **librdkafka clients**: each producer, consumer or admin client runs one native thread
  named ``rdk:main`` (``/proc/self/task/*/comm``), gone once the client is closed or
  garbage collected;
- **PostgreSQL connections**: established TCP connections of this process to a
  PostgreSQL port of the test servers (``/proc/self/fd`` sockets matched in
  ``/proc/net/tcp`` and ``tcp6``);
- **temporary folders**: new entries named ``txsink*`` in :func:`tempfile.gettempdir`,
  which is the session's own folder (``tests/sharedmachine.py``: another session's folders
  are never seen). A name that carries a pid (``txsink-faults-<pid>-...``) counts only
  when the pid is this process: a child that was SIGKILLed leaves its own, and the next
  plan removes such orphans by design (:mod:`txsink.protocol.faults`).

Each check compares a snapshot taken before the test's setup with one taken after its
whole teardown (pytest's own included: its captured log records keep the tracebacks of a
test's errors, and their frames keep what the test used), after a garbage collection of
Python and of the Spark JVM (a query's ``foreachBatch`` function stays in py4j's proxy
pool until the JVM collected the query), polling for up to :data:`GRACE_S` so that what
is stopping can finish. What a module- or session-scoped fixture (a SparkSession, a
server, a cluster) opens while it is set up is baselined then (``pytest_fixture_setup``),
not blamed on the test that first asked for it; so is the first of each thread txsink
starts once per process on purpose (:data:`PROCESS_THREADS`), and the threads of pools a
library keeps for the life of the process (pyiceberg's executor). A leak fails the test (an
error at its teardown) with a message that lists what leaked. A test that runs into a
known bug not fixed yet says so, per kind: ``@pytest.mark.known_leak(rdkafka="why")``
turns that kind into a :class:`LeakWarning`. ``TXSINK_LEAK_CHECK=0`` turns the check off.

Registered from ``integration/conftest.py`` by importing its hooks (``__all__``) into
that module's namespace, so it applies to ``integration/`` only; ``pytest -p leaks`` (with
``integration`` on ``PYTHONPATH``) loads it for any run.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

#: The hooks, for ``from leaks import *`` in a conftest (the rest is imported by name).
__all__ = [
    "pytest_configure",
    "pytest_fixture_setup",
    "pytest_runtest_setup",
    "pytest_runtest_teardown",
]

#: How long a check waits for threads, clients and connections that are closing (a
#: check that finds nothing new returns at once; on a loaded CI machine the JVM's
#: collection of an ended query took more than 5 s).
GRACE_S = 15.0
#: How a temporary folder of txsink's is named, and the pid some of them carry.
_TEMP_PREFIX = "txsink"
_TEMP_PID = re.compile(r"^txsink-[a-z]+-(\d+)-")
#: The thread librdkafka starts for each client instance.
_RDK_MAIN = "rdk:main"
#: Threads txsink starts once per process on purpose, by name: the first one a test starts
#: joins the session's baseline (a second one at the same time is still a leak).
PROCESS_THREADS = {
    # connectors/postgres/stall.py: one watchdog thread per process bounds every wait of
    # every connection for the server (a timer per wait cost too much).
    "txsink-pg-stall",
}
_ESTABLISHED = "01"


class LeakWarning(UserWarning):
    """A leak a test's ``known_leak`` marker accepts, with the marker's reason."""


@dataclass(frozen=True)
class Snapshot:
    """What this process holds at one moment (each item named for the report)."""

    #: (native id, description) of non-daemon threads and threads named ``txsink``
    threads: frozenset[tuple[int, str]]
    #: tids of librdkafka ``rdk:main`` threads: one per client instance
    rdkafka: frozenset[int]
    #: (socket inode, "local -> remote") of established connections to PostgreSQL
    postgres: frozenset[tuple[int, str]]
    #: paths of txsink's temporary folders
    temp: frozenset[str]


@dataclass
class Leaks:
    """What a test left behind: the snapshot's items that are new and not baselined."""

    threads: list[str] = field(default_factory=list)
    rdkafka: list[int] = field(default_factory=list)
    postgres: list[str] = field(default_factory=list)
    temp: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.threads or self.rdkafka or self.postgres or self.temp)

    def report(self, nodeid: str) -> str:
        lines = [f"{nodeid} leaked (still there {GRACE_S:.0f} s after its teardown):"]
        if self.threads:
            lines.append(f"  threads: {', '.join(self.threads)}")
        if self.rdkafka:
            lines.append(
                f"  librdkafka clients not closed: {len(self.rdkafka)} (rdk:main threads "
                f"{', '.join(map(str, self.rdkafka))}): flush/close every Producer, "
                "Consumer and AdminClient"
            )
        if self.postgres:
            lines.append(f"  PostgreSQL connections not closed: {', '.join(self.postgres)}")
        if self.temp:
            lines.append(f"  temporary folders not removed: {', '.join(self.temp)}")
        return "\n".join(lines)


class _State:
    """The session's baseline: what wider-scoped fixtures opened, and PostgreSQL's ports."""

    def __init__(self) -> None:
        self.allowed = Snapshot(frozenset(), frozenset(), frozenset(), frozenset())
        self.pg_ports: set[int] = set()

    def allow_process_threads(self, after: Snapshot) -> None:
        """Baseline the first instance of each of :data:`PROCESS_THREADS` that appears, and
        the threads of the process-wide pools of :func:`_process_pools`."""
        pooled = {t.native_id for pool in _process_pools() for t in getattr(pool, "_threads", ())}
        extra = {(ident, desc) for ident, desc in after.threads if ident in pooled}
        if extra:
            self.allowed = replace(self.allowed, threads=self.allowed.threads | extra)
        known = {d for _, d in self.allowed.threads}
        for ident, desc in after.threads:
            name = desc.rsplit(" (", 1)[0].strip("'")
            if name in PROCESS_THREADS and not any(k.startswith(f"{name!r} ") for k in known):
                self.allowed = replace(self.allowed, threads=self.allowed.threads | {(ident, desc)})
                known.add(desc)

    def allow(self, before: Snapshot, after: Snapshot) -> None:
        a = self.allowed
        self.allowed = Snapshot(
            a.threads | (after.threads - before.threads),
            a.rdkafka | (after.rdkafka - before.rdkafka),
            a.postgres | (after.postgres - before.postgres),
            a.temp | (after.temp - before.temp),
        )


_STATE = _State()


def _process_pools() -> list[Any]:
    """Thread pools a library keeps for the life of the process, by design: pyiceberg's
    ``ExecutorFactory`` (one ``ThreadPoolExecutor`` per process, its threads started as
    work comes, never shut down)."""
    concurrent = sys.modules.get("pyiceberg.utils.concurrent")
    factory = getattr(concurrent, "ExecutorFactory", None)
    instance = getattr(factory, "_instance", None)
    return [instance] if instance is not None else []


def _port_of(dsn: str) -> int | None:
    """The port of a PostgreSQL URL or key=value DSN (5432 when it names none)."""
    if "://" in dsn:
        try:
            return urlsplit(dsn).port or 5432
        except ValueError:
            return None
    m = re.search(r"(?:^|\s)port\s*=\s*(\d+)", dsn)
    return int(m.group(1)) if m else 5432


def _pg_ports() -> set[int]:
    ports = set(_STATE.pg_ports)
    dsn = os.environ.get("TXSINK_PG_DSN")
    if dsn and (port := _port_of(dsn)) is not None:
        ports.add(port)
    return ports


def _threads() -> frozenset[tuple[int, str]]:
    out = set()
    main = threading.main_thread()
    for t in threading.enumerate():
        if t is main or t.native_id is None:
            continue
        if not t.daemon or _TEMP_PREFIX in t.name.lower():
            out.add((t.native_id, f"{t.name!r} ({'daemon' if t.daemon else 'non-daemon'})"))
    return frozenset(out)


def _rdkafka_threads() -> frozenset[int]:
    tids = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == _RDK_MAIN:
                tids.add(int(task.name))
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return frozenset(tids)


def _socket_inodes() -> set[int]:
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _address(hex_addr: str) -> str:
    host, port = hex_addr.split(":")
    if len(host) == 8:  # IPv4, little-endian
        octets = [str(int(host[i : i + 2], 16)) for i in (6, 4, 2, 0)]
        return f"{'.'.join(octets)}:{int(port, 16)}"
    return f"[{host}]:{int(port, 16)}"


def _postgres_connections() -> frozenset[tuple[int, str]]:
    ports = _pg_ports()
    if not ports:
        return frozenset()
    inodes = _socket_inodes()
    out = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) < 10 or cols[3] != _ESTABLISHED:
                continue
            inode = int(cols[9])
            if inode in inodes and int(cols[2].split(":")[1], 16) in ports:
                out.add((inode, f"{_address(cols[1])} -> {_address(cols[2])}"))
    return frozenset(out)


def _temp_folders() -> frozenset[str]:
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return frozenset()
    out = set()
    for name in names:
        if not name.startswith(_TEMP_PREFIX):
            continue
        m = _TEMP_PID.match(name)
        if m is not None and int(m.group(1)) != os.getpid():
            continue  # another process's: it removes its own, or the next plan does
        out.add(os.path.join(tmp, name))
    return frozenset(out)


def snapshot() -> Snapshot:
    """What this process holds now."""
    return Snapshot(_threads(), _rdkafka_threads(), _postgres_connections(), _temp_folders())


def _new(after: frozenset[Any], before: frozenset[Any], allowed: frozenset[Any]) -> list[Any]:
    return sorted(after - before - allowed)


def _leaks(before: Snapshot, after: Snapshot) -> Leaks:
    allowed = _STATE.allowed
    return Leaks(
        threads=[d for _, d in _new(after.threads, before.threads, allowed.threads)],
        rdkafka=_new(after.rdkafka, before.rdkafka, allowed.rdkafka),
        postgres=[d for _, d in _new(after.postgres, before.postgres, allowed.postgres)],
        temp=_new(after.temp, before.temp, allowed.temp),
    )


def _collect_garbage(jvm_too: bool) -> None:
    """Python's garbage collection and, when ``jvm_too`` and this process started a Spark
    JVM, the JVM's. A query's ``foreachBatch`` function (a coordinator and its sinks, with
    their driver connections) stays in py4j's proxy pool until the JVM has collected the
    ended query and its finalizer told py4j to let go; the JVM outlives ``spark.stop()``."""
    gc.collect()
    if not jvm_too or "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is not None:
        with contextlib.suppress(Exception):  # a JVM that is gone holds nothing either
            gateway.jvm.java.lang.System.gc()
            gateway.jvm.java.lang.System.runFinalization()
        gc.collect()


def check(before: Snapshot, *, grace_s: float = GRACE_S) -> Leaks:
    """What is new since ``before`` and still there after ``grace_s`` (none: empty)."""
    deadline = time.monotonic() + grace_s
    rounds = 0
    while True:
        _collect_garbage(jvm_too=rounds in (1, 3) or (rounds > 0 and rounds % 10 == 0))
        rounds += 1
        now = snapshot()
        _STATE.allow_process_threads(now)
        leaks = _leaks(before, now)
        if not leaks or time.monotonic() >= deadline:
            return leaks
        time.sleep(0.1)


def _enabled() -> bool:
    return os.environ.get("TXSINK_LEAK_CHECK", "1") != "0"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Generator[None, Any, None]:
    """Baseline what a module- or session-scoped fixture opens while it is set up."""
    if fixturedef.scope == "function" or not _enabled():
        yield
        return
    before = snapshot()
    outcome = yield
    value = None if outcome.excinfo else outcome.get_result()
    dsn = getattr(value, "dsn", None)
    if isinstance(dsn, str) and (port := _port_of(dsn)) is not None:
        _STATE.pg_ports.add(port)
    _STATE.allow(before, snapshot())


_BEFORE = pytest.StashKey[Snapshot]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """The snapshot before the test's fixtures are set up."""
    if _enabled():
        item.stash[_BEFORE] = snapshot()
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    """After every fixture's teardown and pytest's own (its captured log records hold
    the tracebacks of a test's errors, and their frames what the test used): fail the
    test when it left threads, Kafka clients, PostgreSQL connections or txsink's
    temporary folders behind (see the module doc)."""
    result = yield
    before = item.stash.get(_BEFORE, None)
    if before is None:
        return result
    leaks = check(before)
    marker = item.get_closest_marker("known_leak")
    known: dict[str, str] = dict(marker.kwargs) if marker is not None else {}
    tolerated = Leaks(**{kind: getattr(leaks, kind) for kind in known})
    for kind in known:
        setattr(leaks, kind, [])
    if tolerated:
        why = "; ".join(f"{kind}: {reason}" for kind, reason in known.items())
        warnings.warn(LeakWarning(f"{tolerated.report(item.nodeid)}\n  known: {why}"), stacklevel=1)
    if leaks:
        pytest.fail(leaks.report(item.nodeid), pytrace=False)
    return result


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "known_leak(**kinds): a leak of these kinds (threads, rdkafka, postgres, temp; the "
        "value says why, e.g. the bug) is reported as a LeakWarning, not a failure",
    )
