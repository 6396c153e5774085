"""Fault injection at the protocol's named crash points.

A user-facing feature, not only for our tests: declare where the pipeline
should crash and how, run it, and check the targets read back exactly once.

Crash points, in protocol order::

    during_recovery           driver: recovery made the first unit of a decided epoch visible
                              (or, with no epoch to finish, committed or aborted its first)
    before_precommit          task:   rows written into the open transaction, not yet prepared
    after_precommit           task:   transaction prepared, the ack not yet returned
    before_decision           driver: every ack collected, the decision not yet written
    after_decision            driver: decision durable, nothing committed
    during_commit             driver: the first unit of the epoch is visible in a target (a
                              transaction, a Kafka shard, a snapshot), the others not
    after_commit_before_mark  driver: every sink committed, the committed mark not written

Modes: ``raise`` (an :class:`~txsink.errors.InjectedFault`), ``kill-worker``
(SIGKILL of the Python worker running the task; task points only),
``kill-executor`` (SIGKILL of the executor JVM running the task; task points
on a cluster only: local mode has no executor JVM and refuses it) and
``kill-driver`` (SIGKILL of the driver process, from the driver or the task) and
``kill-target[=NAME]`` (the *target's server* dies: the firing process asks the chaos
supervisor serving the plan's state folder to SIGKILL the server registered as ``NAME``,
or every registered one, waits until it is dead, and goes on against the dead server; see
:mod:`txsink.testing.chaos.targetcrash`. Without a supervisor it raises, naming the fix).

Choose faults by API (``Coordinator(..., faults=FaultPlan.parse("..."))``) or
by environment, so a query in a subprocess can be given one::

    TXSINK_FAULT="after_decision:kill-driver"           POINT[:MODE][@EPOCH][#PARTITION][*TIMES]
    TXSINK_FAULT="during_commit:raise,during_recovery"  several, comma-separated
    TXSINK_FAULT_STATE=/some/dir                        where "already fired" is remembered

A fault fires ``TIMES`` times (default once) *in total*, across processes and
restarts: each firing first creates a marker file in the state folder with an
atomic exclusive create. That is what lets a restarted query get past the
point it crashed at.

A plan given no state folder makes its own, ``<tmp>/txsink-faults-<pid>-*``, and it
goes when that process ends (at exit; a folder whose process was killed goes when
another process makes its next one). The folder derived from ``TXSINK_FAULT`` stays:
it is what keeps a fault from firing again after the restart it caused.
"""

from __future__ import annotations

import atexit
import enum
import hashlib
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field

from txsink.errors import ConfigurationError, InjectedFault
from txsink.kit.process import process_alive
from txsink.kit.procs import EXECUTOR_MAIN_CLASSES, find_executor_jvm

__all__ = [
    "DRIVER_POINTS",
    "EXECUTOR_MAIN_CLASSES",
    "FAULT_LINE",
    "SINGLE_PASS_POINTS",
    "TARGET_DONE",
    "TARGET_KILL_WAIT_S",
    "TARGET_REQUEST",
    "TASK_POINTS",
    "CrashPoint",
    "Fault",
    "FaultMode",
    "FaultPlan",
    "find_executor_jvm",
]


class CrashPoint(enum.StrEnum):
    DURING_RECOVERY = "during_recovery"
    BEFORE_PRECOMMIT = "before_precommit"
    AFTER_PRECOMMIT = "after_precommit"
    BEFORE_DECISION = "before_decision"
    AFTER_DECISION = "after_decision"
    DURING_COMMIT = "during_commit"
    AFTER_COMMIT_BEFORE_MARK = "after_commit_before_mark"
    #: In a single-pass task, after the driver's answer "commit", before the task commits
    #: its open transaction: only sinks that commit in the task reach it.
    BEFORE_TASK_COMMIT = "before_task_commit"


class FaultMode(enum.StrEnum):
    RAISE = "raise"
    KILL_WORKER = "kill-worker"
    KILL_EXECUTOR = "kill-executor"
    KILL_DRIVER = "kill-driver"
    KILL_TARGET = "kill-target"


#: How the stderr line of a firing fault begins; :mod:`txsink.runner` reads it as the cause
#: of a run's end.
FAULT_LINE = "txsink: injecting fault "

TASK_POINTS = frozenset(
    {CrashPoint.BEFORE_PRECOMMIT, CrashPoint.AFTER_PRECOMMIT, CrashPoint.BEFORE_TASK_COMMIT}
)
DRIVER_POINTS = frozenset(CrashPoint) - TASK_POINTS
#: Points only single-pass epochs reach (a sink that commits in its tasks).
SINGLE_PASS_POINTS = frozenset({CrashPoint.BEFORE_TASK_COMMIT})
_TASK_ONLY_MODES = {
    FaultMode.KILL_WORKER: "there is no Python worker",
    FaultMode.KILL_EXECUTOR: "there is no executor",
}

#: How long a ``kill-target`` fault waits for the supervisor to answer that the target died.
TARGET_KILL_WAIT_S = 120.0
#: The suffixes of the request a ``kill-target`` fault leaves in the plan's state folder
#: and of the answer the supervisor (:mod:`txsink.testing.chaos.targetcrash`) writes next to it.
TARGET_REQUEST, TARGET_DONE = ".kill-target", ".killed"


@dataclass(frozen=True)
class Fault:
    """One fault: where, how, and optionally only at one epoch / partition."""

    point: CrashPoint
    mode: FaultMode = FaultMode.RAISE
    epoch: int | None = None
    partition: int | None = None
    times: int = 1
    #: ``kill-target`` only: the name the supervisor registered the server under (``None``:
    #: every registered server).
    target: str | None = None

    def __post_init__(self) -> None:
        if self.target is not None and self.mode is not FaultMode.KILL_TARGET:
            raise ValueError(f"fault {self.point}:{self.mode}: =NAME applies to kill-target only")
        if self.target is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", self.target):
            raise ValueError(f"fault kill-target={self.target!r}: use letters, digits, _ . -")
        if self.mode in _TASK_ONLY_MODES and self.point not in TASK_POINTS:
            raise ValueError(
                f"fault {self.point}:{self.mode}: {_TASK_ONLY_MODES[self.mode]} at a "
                f"driver-side point; use {self.mode} with "
                f"{sorted(p.value for p in TASK_POINTS)}, or kill-driver"
            )
        if self.partition is not None and self.point not in TASK_POINTS:
            raise ValueError(f"fault {self.point}: #PARTITION applies to task points only")
        if self.times < 1:
            raise ValueError("fault *TIMES must be >= 1")

    @classmethod
    def parse(cls, spec: str) -> Fault:
        """Parse ``POINT[:MODE[=TARGET]][@EPOCH][#PARTITION][*TIMES]``."""
        text = spec.strip()
        times = partition = epoch = None
        if "*" in text:
            text, t = text.rsplit("*", 1)
            times = int(t)
        if "#" in text:
            text, p = text.rsplit("#", 1)
            partition = int(p)
        if "@" in text:
            text, e = text.rsplit("@", 1)
            epoch = int(e)
        point, _, mode = text.partition(":")
        mode, _, target = mode.partition("=")
        try:
            cp = CrashPoint(point)
        except ValueError:
            raise ValueError(
                f"unknown crash point {point!r} in {spec!r}; known: {[p.value for p in CrashPoint]}"
            ) from None
        try:
            fm = FaultMode(mode or "raise")
        except ValueError:
            raise ValueError(
                f"unknown fault mode {mode!r} in {spec!r}; known: {[m.value for m in FaultMode]}"
            ) from None
        return cls(cp, fm, epoch, partition, times or 1, target or None)

    def __str__(self) -> str:
        s = f"{self.point}:{self.mode}"
        if self.target is not None:
            s += f"={self.target}"
        if self.epoch is not None:
            s += f"@{self.epoch}"
        if self.partition is not None:
            s += f"#{self.partition}"
        if self.times != 1:
            s += f"*{self.times}"
        return s


#: State folders this process made for plans given none: (creator pid, path).
_OWN_DIRS: list[tuple[int, str]] = []
_OWN_NAME = re.compile(r"txsink-faults-(\d+)-[a-z0-9_]+")


def _own_state_dir() -> str:
    """A new state folder for a plan given none, removed when this process ends.

    The pid in its name lets the next process that makes one remove the folders of
    processes that ended without cleaning up (a ``kill-driver`` fault's SIGKILL)."""
    _remove_orphans()
    path = tempfile.mkdtemp(prefix=f"txsink-faults-{os.getpid()}-")
    if not _OWN_DIRS:
        atexit.register(_remove_own_dirs)
    _OWN_DIRS.append((os.getpid(), path))
    return path


def _remove_own_dirs() -> None:
    # A forked child inherits this handler and the list: only the maker removes its folders.
    for pid, path in _OWN_DIRS:
        if pid == os.getpid():
            shutil.rmtree(path, ignore_errors=True)


def _remove_orphans() -> None:
    """Remove the own-made state folders of processes that no longer run."""
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        m = _OWN_NAME.fullmatch(name)
        if m is not None and not process_alive(int(m.group(1))):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


@dataclass(frozen=True)
class FaultPlan:
    """Faults to inject, and the folder that remembers which already fired.

    Picklable: the plan travels to Spark tasks with the coordinator's task.
    For task points on a real cluster, ``state_dir`` must be on a filesystem
    the executors share with the driver (local mode always does). Without one, the
    plan makes its own temporary folder, removed when this process ends.
    """

    faults: tuple[Fault, ...]
    state_dir: str = field(default_factory=_own_state_dir)

    @classmethod
    def parse(cls, specs: str, state_dir: str | None = None) -> FaultPlan:
        faults = tuple(Fault.parse(s) for s in specs.split(",") if s.strip())
        if state_dir is None:
            return cls(faults)
        return cls(faults, state_dir)

    @classmethod
    def from_env(cls) -> FaultPlan | None:
        """The plan given by ``TXSINK_FAULT`` / ``TXSINK_FAULT_STATE``, if any.

        Without ``TXSINK_FAULT_STATE`` the state folder is derived from the plan
        text, so every process (and every restart) given the same plan shares it
        and a fault does not fire again after the restart it caused. Delete the
        folder (its path is printed when a fault fires) to re-arm the plan.
        """
        specs = os.environ.get("TXSINK_FAULT", "").strip()
        if not specs:
            return None
        state = os.environ.get("TXSINK_FAULT_STATE") or os.path.join(
            tempfile.gettempdir(),
            "txsink-faults-" + hashlib.sha256(specs.encode()).hexdigest()[:12],
        )
        return cls.parse(specs, state)

    def fire(
        self,
        point: CrashPoint,
        *,
        epoch: int,
        partition: int | None = None,
        driver_pid: int | None = None,
        driver_host: str | None = None,
    ) -> None:
        """Inject the first matching fault that has firings left; no-op otherwise."""
        for index, fault in enumerate(self.faults):
            if fault.point is not point:
                continue
            if fault.epoch is not None and fault.epoch != epoch:
                continue
            if fault.partition is not None and fault.partition != partition:
                continue
            # Found before the marker is claimed: a refused kill-executor has not fired.
            executor = _executor_pid(fault, epoch, partition, point)
            marker = self._claim(index, fault)
            if marker is None:
                continue
            where = f"epoch={epoch}" + (f" partition={partition}" if partition is not None else "")
            remote = driver_host is not None and driver_host != socket.gethostname()
            victim, action = _victim(fault, executor, driver_pid, remote)
            print(
                f"{FAULT_LINE}{fault} at {where}: {action} (state: {self.state_dir})",
                file=sys.stderr,
                flush=True,
            )
            if fault.mode is FaultMode.KILL_DRIVER and remote:
                raise InjectedFault(
                    f"injected fault {fault}: this task runs on {socket.gethostname()}, the "
                    f"driver on {driver_host}; a task can only kill a driver on its own host "
                    "(local mode). Use kill-driver at a driver-side point on a cluster",
                    epoch=epoch,
                    partition=partition,
                    phase=str(point),
                )
            if fault.mode is FaultMode.RAISE:
                raise InjectedFault(
                    f"injected fault {fault}", epoch=epoch, partition=partition, phase=str(point)
                )
            if fault.mode is FaultMode.KILL_TARGET:
                _await_target_kill(marker, fault, epoch, partition, point)
                return
            if executor is not None:
                # The executor's death takes its task down; this worker goes with it rather
                # than linger as an orphan.
                os.kill(executor, signal.SIGKILL)
            os.kill(victim, signal.SIGKILL)
            time.sleep(120)  # a task that killed its driver waits to be torn down with it
            raise InjectedFault(f"injected fault {fault}: process {victim} did not die")

    def fired(self) -> list[str]:
        """Marker names of the faults that fired so far."""
        try:
            names = os.listdir(self.state_dir)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if _is_marker(n))

    def _claim(self, index: int, fault: Fault) -> str | None:
        """The marker this firing created, or ``None`` when every firing is taken."""
        os.makedirs(self.state_dir, exist_ok=True)
        for n in range(fault.times):
            marker = os.path.join(self.state_dir, f"{index:02d}-{fault.point}-{n}")
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue
            os.write(fd, f"{fault} pid={os.getpid()} at={time.time()}\n".encode())
            os.fsync(fd)
            os.close(fd)
            return marker
        return None


def _is_marker(name: str) -> bool:
    """A fault's marker, not a ``kill-target`` request or answer next to it."""
    return not name.endswith((TARGET_REQUEST, TARGET_DONE, ".tmp"))


def _await_target_kill(
    marker: str, fault: Fault, epoch: int, partition: int | None, point: CrashPoint
) -> None:
    """Ask the supervisor to kill the target's server and wait for its answer.

    The request is a file next to the fault's marker (the supervisor polls the state
    folder); the answer is the file the supervisor writes once the server is dead: empty,
    or the text of what went wrong, which is raised here. Why not kill it from here: the
    server is the supervisor's to restart, and it may run where this process cannot reach.
    """
    request, done = marker + TARGET_REQUEST, marker + TARGET_DONE
    with open(request + ".tmp", "w") as f:
        f.write(fault.target or "")
    os.replace(request + ".tmp", request)
    deadline = time.monotonic() + TARGET_KILL_WAIT_S
    while not os.path.exists(done):
        if time.monotonic() > deadline:
            raise InjectedFault(
                f"injected fault {fault}: no supervisor killed the target in "
                f"{TARGET_KILL_WAIT_S:.0f}s. kill-target needs one serving the fault state "
                f"folder {os.path.dirname(marker)}: run the pipeline under "
                "txsink.testing.run_chaos(..., targets={name: control}) or `txsink chaos` "
                "with --targets, or serve the folder with txsink.testing.TargetCrashes",
                epoch=epoch,
                partition=partition,
                phase=str(point),
            )
        time.sleep(0.02)
    with open(done) as f:
        failure = f.read().strip()
    if failure:
        raise InjectedFault(
            f"injected fault {fault}: the supervisor could not kill the target: {failure}",
            epoch=epoch,
            partition=partition,
            phase=str(point),
        )


def _victim(
    fault: Fault, executor: int | None, driver_pid: int | None, remote: bool
) -> tuple[int, str]:
    """The process a fault kills, and what the fault line says it does."""
    me = os.getpid()
    if fault.mode is FaultMode.RAISE:
        return me, "raising InjectedFault"
    if fault.mode is FaultMode.KILL_TARGET:
        return me, f"asking the supervisor to kill the server of target {fault.target or '*'}"
    if fault.mode is FaultMode.KILL_DRIVER and remote:
        return me, "the driver runs on another host: raising InjectedFault instead"
    if executor is not None:
        return me, f"killing the executor JVM (pid {executor}) and this Python worker (pid {me})"
    if fault.mode is FaultMode.KILL_WORKER:
        return me, f"killing this task's Python worker (pid {me})"
    pid = driver_pid or me
    return pid, f"killing the driver (pid {pid})"


def _executor_pid(fault: Fault, epoch: int, partition: int | None, point: CrashPoint) -> int | None:
    """The executor JVM to kill for a ``kill-executor`` fault; ``None`` for other modes.

    Raises :class:`~txsink.errors.ConfigurationError` when the task has no executor JVM of
    its own (local mode: the tasks run inside the driver's JVM, which is never killed).
    """
    if fault.mode is not FaultMode.KILL_EXECUTOR:
        return None
    pid = find_executor_jvm()
    if pid is None:
        raise ConfigurationError(
            f"fault {fault}: this task runs in no executor JVM of its own (local mode runs "
            "tasks inside the driver's JVM, which kill-executor never kills). Run on a "
            "cluster (standalone, local-cluster[N,C,M], YARN, Kubernetes), or use kill-worker",
            epoch=epoch,
            partition=partition,
            phase=str(point),
        )
    return pid
