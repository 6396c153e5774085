"""The driver lease: one live driver per query, told apart *before* anything is voided.

Voids and rounds (:mod:`txsink.protocol.log`) keep the data exactly-once whatever two drivers do,
but the one that recovers second voids the first one's round and aborts its open
transactions, so two drivers started together disrupt each other. The lease lets the
second one refuse first (:class:`~txsink.errors.DriverLeaseError`) while the holder is
alive, and take over as before once it is not.

Records, in the log's store, each created once with the store's create-if-absent::

    lease/<generation:012d>.json   host, pid, process start, run id, acquired_at,
                                   renewed_at, lease_s (and "released" on a clean stop)

The newest generation is the lease. Acquiring or renewing *creates* the next generation,
so of two drivers racing for it exactly one wins (the conditional write is the store's
own: a hard link on files, ``If-None-Match: *`` on S3); a driver whose next generation
was created by someone else has lost the lease. Old generations are deleted (the last
two are kept, so a reader that listed just before a renewal still finds its record).

A lease is *free* when it is released, expired (``renewed_at + lease_s`` is past, by the
reader's clock: keep clocks within a fraction of ``lease_s``), or its holder is known
dead: on the same host its pid no longer runs, or runs another process (the process
start time differs: a reused pid), or it is this very process (a coordinator rebuilt in
the driver, as the Data Source path and Spark Connect do). A holder on another host is
only known dead by expiry: there, a take-over after a crash waits up to ``lease_s``.

Renewal: at each epoch (:meth:`LeaseKeeper.hold`), and from a daemon thread every
``lease_s / 4`` while ``active()`` says the query runs, so a long epoch or a long trigger
interval never lets the lease lapse under a live driver. The thread writes lease records
only, never protocol records: a renewal that loses the race (another driver took over)
marks the lease lost, and the next :meth:`~LeaseKeeper.hold` raises
:class:`~txsink.errors.FencedError`. The lease says the driver *process* lives; a driver
hung but alive keeps it: stop (kill) it, and a driver on the same host takes over at
once. Failure scenarios, each pinned by a test (tests/test_lease.py, integration
test_lease.py):

1. two drivers start together: the second refuses before voiding anything (before its
   query touches Spark's checkpoint when the lease is held before ``start()``:
   ``Coordinator.hold_lease``; Spark's own race for the checkpoint otherwise);
2. the holder was SIGKILLed, restarted on the same host: taken over at once;
3. the holder froze (SIGSTOP) past ``lease_s``: taken over; resumed, it gets FencedError;
4. the holder stopped cleanly: released, taken over at once;
5. an operator's ``txsink recover`` while a driver runs: refused the same way, unless
   ``--break-lease`` (the operator knows the holder is dead).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from txsink.errors import DriverLeaseError, FencedError, LogError
from txsink.kit.jsonrows import dumps_record
from txsink.kit.process import process_alive
from txsink.kit.text import when
from txsink.observe.logs import get_logger
from txsink.protocol.log import TxLog

__all__ = [
    "DEFAULT_LEASE_S",
    "DriverLease",
    "LeaseKeeper",
    "check_lease_s",
    "current_lease",
    "default_lease_s",
    "live_holder",
    "process_identity",
    "until_the_query_runs",
]

_PREFIX = "lease/"
LEASE_VERSION = 1
#: The shortest default lease: a driver renews every lease_s / 4, so a pause of a few
#: seconds (a GC, a slow store) never looks like a dead driver.
DEFAULT_LEASE_S = 60.0
_KEEP = 2  # generations kept: the newest and the one before


def check_lease_s(lease_s: float | None) -> float | None:
    """``lease_s`` as given (``None``: the default), refused unless positive."""
    if lease_s is not None and not lease_s > 0:
        raise ValueError(f"lease_s must be > 0 seconds, got {lease_s}")
    return lease_s


def default_lease_s(trigger_interval_s: float | None) -> float:
    """``max(60 s, 3 x trigger interval)``: a driver between two epochs of a slow trigger
    is not taken for dead even if its renewal thread was starved once or twice."""
    return max(DEFAULT_LEASE_S, 3.0 * (trigger_interval_s or 0.0))


@dataclass(frozen=True)
class DriverLease:
    """One generation of the lease: who holds it, since when, until when."""

    generation: int
    host: str
    pid: int
    started: str
    run_id: str
    acquired_at: float
    renewed_at: float
    lease_s: float
    released: bool = False
    by: str = "driver"

    def expires_at(self) -> float:
        return self.renewed_at + self.lease_s

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, since {when(self.acquired_at)}"

    def to_doc(self) -> dict[str, Any]:
        return {"version": LEASE_VERSION, **asdict(self)}


def process_identity(pid: int | None = None) -> str:
    """What tells a process apart from a later one with the same pid: the boot id and the
    process's start time in clock ticks (Linux ``/proc``); ``""`` where unknown."""
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return ""
    # Field 22 (starttime) counts after the command name, which may hold spaces: split
    # after its closing parenthesis.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return f"{boot}:{fields[19].decode()}" if len(fields) > 19 else ""


def _holder_dead(lease: DriverLease, host: str, me: str, pid: int) -> bool:
    """Whether the holder is known dead from here (same host only), or is this very
    driver process (an earlier coordinator of it: dropped, or rebuilt from a pickle)."""
    if lease.host != host:
        return False
    if lease.pid == pid and (not lease.started or lease.started == me):
        return True
    if not process_alive(lease.pid):
        return True
    if lease.started:
        now = process_identity(lease.pid)
        return bool(now) and now != lease.started
    return False


def _parse(log: TxLog, key: str, raw: bytes) -> DriverLease:
    try:
        doc = json.loads(raw)
        version = doc.get("version")
        if type(version) is not int or not 1 <= version <= LEASE_VERSION:
            raise LogError(
                f"txsink log record {key} at {log.location} has lease version {version!r}; "
                f"this txsink reads 1 to {LEASE_VERSION}: upgrade txsink to the release "
                "that wrote it"
            )
        return DriverLease(
            generation=int(doc["generation"]),
            host=str(doc["host"]),
            pid=int(doc["pid"]),
            started=str(doc.get("started", "")),
            run_id=str(doc["run_id"]),
            acquired_at=float(doc["acquired_at"]),
            renewed_at=float(doc["renewed_at"]),
            lease_s=float(doc["lease_s"]),
            released=bool(doc.get("released", False)),
            by=str(doc.get("by", "driver")),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise LogError(
            f"txsink log record {key} at {log.location} is not a driver lease ({err}): "
            "delete the lease/ folder of the log while no driver runs"
        ) from err


def _key(generation: int) -> str:
    return f"{_PREFIX}{generation:012d}.json"


def _generations(log: TxLog) -> list[int]:
    out = []
    for key in log.store.list(_PREFIX):
        name = key.rsplit("/", 1)[-1]
        if name.endswith(".json") and name[:-5].isdigit():
            out.append(int(name[:-5]))
    return sorted(out)


def current_lease(log: TxLog) -> DriverLease | None:
    """The newest lease record of ``log`` (``None``: no driver ever held one)."""
    for _ in range(5):  # a generation deleted between the listing and the read: list again
        gens = _generations(log)
        if not gens:
            return None
        raw = log.store.read(_key(gens[-1]))
        if raw is not None:
            return _parse(log, _key(gens[-1]), raw)
    return None


def live_holder(log: TxLog, *, clock: Callable[[], float] = time.time) -> DriverLease | None:
    """The lease of another driver that is alive as far as this process can tell (fresh,
    not released, not known dead), else ``None``: what a driver starting now would meet."""
    lease = current_lease(log)
    if lease is None or lease.released or clock() >= lease.expires_at():
        return None
    pid = os.getpid()
    if _holder_dead(lease, socket.gethostname(), process_identity(pid), pid):
        return None
    return lease


def refusal(lease: DriverLease) -> DriverLeaseError:
    """The error of a driver (or operator) that finds ``lease`` held by a live driver."""
    who = "an operator's txsink recover" if lease.by == "operator" else "another driver"
    return DriverLeaseError(
        f"{who} ({lease.describe()}) is running this query: stop it or wait until its "
        f"lease expires (lease_s={lease.lease_s:g}, renewed {when(lease.renewed_at)}, "
        f"expires {when(lease.expires_at())}). Nothing was voided or aborted. If it "
        "is known dead (a host that is gone), `txsink recover --break-lease` takes the "
        "lease over",
        phase="lease",
    )


#: Keepers of this process holding a lease, released at exit (weakly: a dropped
#: coordinator's keeper does not outlive it).
_KEEPERS: weakref.WeakSet[LeaseKeeper] = weakref.WeakSet()


@atexit.register
def _release_all() -> None:
    for keeper in list(_KEEPERS):
        with contextlib.suppress(Exception):
            keeper.release()


class LeaseKeeper:
    """Acquires, renews and releases one driver's lease on a log.

    Args:
        log: the query's txsink log.
        lease_s: how long a lease lives without renewal.
        by: who holds it (``"driver"``, or ``"operator"`` for ``txsink recover``).
        clock: wall-clock time (injectable for tests).
        host: this host's name (injectable for tests).
        pid: the driver's process (default: this one; the Data Source path names the Spark
            driver, as its planning runs in a Python worker that may change between batches).
    """

    def __init__(
        self,
        log: TxLog,
        lease_s: float,
        *,
        by: str = "driver",
        clock: Callable[[], float] = time.time,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0 seconds, got {lease_s}")
        self.log = log
        self.lease_s = float(lease_s)
        self.by = by
        self.run_id = uuid.uuid4().hex
        self._clock = clock
        self._host = host or socket.gethostname()
        self._pid = os.getpid() if pid is None else pid
        self._me = process_identity(self._pid)
        self._lock = threading.RLock()
        self._held: DriverLease | None = None
        self._lost: DriverLease | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._active: Callable[[], bool | None] = lambda: None
        self._log = get_logger(__name__)

    @property
    def held(self) -> DriverLease | None:
        return self._held

    def hold(self, *, force: bool = False) -> DriverLease:
        """Acquire the lease, or renew it if this keeper holds it.

        Raises :class:`~txsink.errors.DriverLeaseError` when another live driver holds
        a fresh lease (``force``: take it anyway), :class:`~txsink.errors.FencedError`
        when this keeper held it and another driver took it over since.
        """
        with self._lock:
            if self._lost is not None:
                raise self._fenced(self._lost)
            if self._held is None:
                return self._acquire(force)
            return self._renew(due_only=True)

    def keep_alive(self, active: Callable[[], bool | None]) -> None:
        """Renew from a daemon thread every ``lease_s / 4`` while ``active()`` is true
        (false: skip this tick); once it returns ``None`` (the query stopped) the thread
        ends and the lease is released."""
        with self._lock:
            self._active = active
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"txsink-lease-{self.run_id[:8]}", daemon=True
            )
            self._thread.start()

    def lengthen(self, lease_s: float) -> None:
        """Make the lease at least ``lease_s`` long from its next renewal on (a lease held
        before the query started, whose trigger interval was not known yet)."""
        with self._lock:
            self.lease_s = max(self.lease_s, float(lease_s))

    def release(self) -> None:
        """Stop renewing and mark the lease free (a clean stop: the next driver takes
        over at once). A lease another driver took over is left alone."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock:
            held, self._held = self._held, None
            _KEEPERS.discard(self)
            if held is None:
                return
            now = self._clock()
            gone = replace(held, generation=held.generation + 1, renewed_at=now, released=True)
            with contextlib.suppress(Exception):  # best effort: expiry frees it anyway
                if self.log.store.create(_key(gone.generation), dumps_record(gone.to_doc())):
                    self._prune(gone.generation)

    # -- internals -----------------------------------------------------------------

    def _acquire(self, force: bool) -> DriverLease:
        while True:
            now = self._clock()
            cur = current_lease(self.log)
            if cur is not None and not force and not self._free(cur, now):
                raise refusal(cur)
            mine = DriverLease(
                generation=0 if cur is None else cur.generation + 1,
                host=self._host,
                pid=self._pid,
                started=self._me,
                run_id=self.run_id,
                acquired_at=now,
                renewed_at=now,
                lease_s=self.lease_s,
                by=self.by,
            )
            if self.log.store.create(_key(mine.generation), dumps_record(mine.to_doc())):
                self._held = mine
                _KEEPERS.add(self)
                self._prune(mine.generation)
                if cur is not None and not cur.released and cur.run_id != self.run_id:
                    self._log.log(
                        logging.INFO if self._same_process(cur) else logging.WARNING,
                        "took over the driver lease of %s (%s)",
                        cur.describe(),
                        "broken by hand" if force else self._why_free(cur, now),
                    )
                return mine
            # Another driver created that generation first: look again.

    def _renew(self, *, due_only: bool) -> DriverLease:
        held = self._held
        if held is None:
            raise RuntimeError("LeaseKeeper._renew without a lease")
        now = self._clock()
        gens = _generations(self.log)
        if gens and gens[-1] != held.generation:
            return self._lose(gens[-1], take_back=due_only)
        if due_only and now - held.renewed_at < self.lease_s / 4 and held.lease_s == self.lease_s:
            return held
        nxt = replace(held, generation=held.generation + 1, renewed_at=now, lease_s=self.lease_s)
        if not self.log.store.create(_key(nxt.generation), dumps_record(nxt.to_doc())):
            return self._lose(nxt.generation, take_back=due_only)
        self._held = nxt
        self._prune(nxt.generation)
        return nxt

    def _lose(self, generation: int, *, take_back: bool) -> DriverLease:
        raw = self.log.store.read(_key(generation))
        other = _parse(self.log, _key(generation), raw) if raw is not None else None
        if other is None or other.run_id == self.run_id:  # cannot happen: one writer per run
            raise LogError(f"the driver lease at {self.log.location} changed under its holder")
        if self._same_process(other):
            # Another coordinator of this very driver process took it (a pipeline built
            # again in the driver): this one is no zombie. Used again, it takes the lease
            # back; its renewal thread leaves it to the other meanwhile.
            self._held = None
            _KEEPERS.discard(self)
            if not take_back:
                return other
            mine = self._acquire(False)
            if self._thread is not None and not self._thread.is_alive():
                self.keep_alive(self._active)
            return mine
        self._lost, self._held = other, None
        _KEEPERS.discard(self)
        self._stop.set()
        raise self._fenced(other)

    def _fenced(self, other: DriverLease) -> FencedError:
        return FencedError(
            f"this driver's lease on the query was taken over by another driver "
            f"({other.describe()}{', by hand' if other.by == 'operator' else ''}): this "
            "driver was taken for dead (frozen or cut off for longer than its lease, "
            f"lease_s={self.lease_s:g}). It stops here; the other driver runs the query",
            phase="lease",
        )

    def _same_process(self, lease: DriverLease) -> bool:
        return (
            lease.host == self._host
            and lease.pid == self._pid
            and (not lease.started or lease.started == self._me)
        )

    def _free(self, lease: DriverLease, now: float) -> bool:
        return (
            lease.released
            or lease.run_id == self.run_id
            or now >= lease.expires_at()
            or _holder_dead(lease, self._host, self._me, self._pid)
        )

    def _why_free(self, lease: DriverLease, now: float) -> str:
        if now >= lease.expires_at():
            return f"expired {now - lease.expires_at():.0f}s ago"
        if lease.pid == self._pid and lease.host == self._host:
            return "an earlier coordinator of this driver process"
        return "its process is gone"

    def _prune(self, newest: int) -> None:
        for gen in _generations(self.log):
            if gen <= newest - _KEEP:
                with contextlib.suppress(Exception):
                    self.log.store.delete(_key(gen))

    def _run(self) -> None:
        interval = self.lease_s / 4
        while not self._stop.wait(interval):
            try:
                active = self._active()
            except Exception:  # the session is gone: the query is over
                active = None
            if active is None:
                break
            if not active:
                continue
            try:
                with self._lock:
                    if self._held is None:
                        return
                    self._renew(due_only=False)
                    if self._held is None:  # yielded to a keeper of this same process
                        return
            except FencedError:
                return  # lost: hold() says so on the driver's next epoch
            except Exception as err:  # a store hiccup: the next tick tries again
                self._log.warning("could not renew the driver lease: %s", err)
        if not self._stop.is_set():
            self.release()  # the query stopped: the lease is free for the next driver


def until_the_query_runs() -> bool:
    """The renewal probe of a lease held before the query started: renew until the first
    epoch replaces it with the query's own probe (or the Coordinator's ``close``). A
    process that cannot watch its query renews with it while the process lives."""
    return True
