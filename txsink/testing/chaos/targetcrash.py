"""The target crashes: SIGKILL the server a sink writes to, keep it down, start it again.

txsink's own faults kill txsink's side (a worker, an executor, the driver). A target's
server dies too: PostgreSQL must bring back its prepared transactions from the WAL, a
Kafka broker its transaction state, an S3 server its open multipart uploads, and txsink's
recovery must then commit the decided ones and abort the rest. Two ways to crash one:

- **At a named crash point**, the fault mode ``kill-target[=NAME]``
  (``"after_decision:kill-target=postgres@1"``): the process that reaches the point asks
  the supervisor to kill the server, waits until it is dead, and goes on against the dead
  server, exactly where the protocol stands.
- **At a random moment**, :meth:`TargetCrashes.kill_after`: a timer of the supervisor's.

The supervisor is :class:`TargetCrashes`: it serves the fault plan's state folder (the
request is a file there, so the fault may fire in the driver or in a task's Python worker),
kills the server through its :class:`TargetControl`, keeps it down at least ``down_s``
seconds, and starts it again (:meth:`TargetCrashes.restore`) before the query restarts,
as an operator or an orchestrator would: the server is down as long as the pipeline takes
to fail against it (a Kafka producer retries until its own timeouts).
:func:`~txsink.testing.chaos.run_chaos` runs one when given ``targets=``; the query is
restarted only once every server is back. A control is three methods, so a server of any
kind fits: :class:`ServerProcess` is one for a server on this machine (a pid file, a start
command); one that restarts a container, a pod or a cloud instance is as short::

    from txsink.testing import ChaosPlan, ServerProcess, run_chaos

    postgres = ServerProcess(
        "postgres",
        pid_file="/var/lib/postgresql/data/postmaster.pid",
        start_command=["pg_ctl", "-D", "/var/lib/postgresql/data", "-w", "start"],
        port=5432,
    )
    run_chaos(pipeline, ChaosPlan.parse("after_decision:kill-target=postgres@1"),
              workdir=..., sinks_verifiers=..., targets={"postgres": postgres})

Never point one at a server anything else depends on: it is killed for real.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol, runtime_checkable

from txsink.protocol.faults import TARGET_DONE, TARGET_REQUEST

__all__ = [
    "ServerProcess",
    "TargetControl",
    "TargetCrashes",
    "TargetKill",
    "child_pids",
    "process_alive",
]

_log = logging.getLogger(__name__)


@runtime_checkable
class TargetControl(Protocol):
    """A target's server, to crash and to start again.

    ``kill`` must return only once the server is dead (what it had not written to disk is
    lost, as in a power cut); ``start`` only once it answers again.
    """

    def kill(self) -> None: ...

    def start(self) -> None: ...

    def running(self) -> bool: ...


@dataclass
class ServerProcess:
    """A server on this machine: SIGKILLed by pid, started again by a command.

    Args:
        name: what faults call it (``kill-target=NAME``).
        pid_file: a file whose first line is the server's pid (PostgreSQL's
            ``postmaster.pid``, MinIO or Kafka started with one); or give ``pid``.
        pid: returns the server's pid now (``None``: not running).
        start: the command that starts it again and returns once it is up (or a callable).
        port: where it listens on ``host``: :meth:`running` connects there.
        children: also kill the processes whose parent is the server (PostgreSQL's
            backends: a postmaster killed alone leaves them holding its shared memory).
    """

    name: str
    start_command: Sequence[str] | Callable[[], object]
    port: int
    host: str = "127.0.0.1"
    pid_file: str | None = None
    pid: Callable[[], int | None] | None = None
    children: bool = True
    kills: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if (self.pid_file is None) == (self.pid is None):
            raise ValueError(f"ServerProcess {self.name}: give exactly one of pid_file, pid")

    def _pid(self) -> int | None:
        if self.pid is not None:
            return self.pid()
        try:
            return int(Path(str(self.pid_file)).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        pid = self._pid()
        victims = [] if pid is None else [pid, *(child_pids(pid) if self.children else [])]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(process_alive(v) for v in victims):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: pid(s) {victims} still alive 30 s after SIGKILL")
            time.sleep(0.05)
        self.kills += 1

    def start(self) -> None:
        if callable(self.start_command):
            self.start_command()
        else:
            subprocess.run(list(self.start_command), check=True, timeout=300)

    def running(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False


def process_alive(pid: int) -> bool:
    """Running; a zombie (dead, not yet reaped) is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def child_pids(parent: int) -> list[int]:
    """The pids whose parent is ``parent`` (from ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
                    found.append(int(entry.name))
    return found


@dataclass(frozen=True)
class TargetKill:
    """One kill: which server, when (wall clock), why (the fault, or ``timer``), when it
    was up again (``None``: not yet)."""

    target: str
    at: float
    cause: str
    restarted_at: float | None = None

    @property
    def down_s(self) -> float | None:
        return None if self.restarted_at is None else self.restarted_at - self.at


class TargetCrashes:
    """Serves ``kill-target`` faults of the plan whose state folder is ``state_dir``.

    Args:
        state_dir: the fault plan's state folder (``FaultPlan.state_dir``,
            ``TXSINK_FAULT_STATE``; ``run_chaos`` uses ``workdir/faults``).
        targets: name -> control. A fault naming no target kills every one.
        down_s: how long a killed server stays down before it is started again.
        poll_s: how often the folder is looked at.

    Use it as a context manager (or :meth:`start` / :meth:`stop`); :meth:`restore` waits
    until every killed server is up again (call it before restarting the query).
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        targets: Mapping[str, TargetControl],
        *,
        down_s: float = 2.0,
        poll_s: float = 0.05,
    ) -> None:
        if not targets:
            raise ValueError("TargetCrashes: give at least one target")
        self.state_dir = Path(state_dir)
        self.targets = dict(targets)
        self.down_s = down_s
        self.poll_s = poll_s
        self.kills: list[TargetKill] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._timers: list[threading.Timer] = []
        #: name -> monotonic time it may be started again
        self._down_until: dict[str, float] = {}

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> TargetCrashes:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._serve, name="txsink-target-crashes")
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and cancel pending timers; servers still down are started again."""
        self._stop.set()
        for timer in self._timers:
            timer.cancel()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.restore()

    def __enter__(self) -> TargetCrashes:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- killing ------------------------------------------------------------------------

    def kill(self, name: str | None, cause: str) -> None:
        """Kill ``name`` (``None``: every target) now; it stays down ``down_s`` seconds."""
        names = list(self.targets) if name is None else [name]
        unknown = [n for n in names if n not in self.targets]
        if unknown:
            raise KeyError(
                f"kill-target={unknown[0]}: no such target; registered: {sorted(self.targets)}"
            )
        for each in names:
            self.targets[each].kill()
            with self._lock:
                self.kills.append(TargetKill(each, time.time(), cause))
                self._down_until[each] = time.monotonic() + self.down_s
            _log.warning("target %s killed (%s); down for %.1fs", each, cause, self.down_s)

    def kill_after(self, seconds: float, name: str | None = None) -> None:
        """Kill ``name`` (``None``: every target) ``seconds`` from now: a random moment."""

        def fire() -> None:
            try:
                self.kill(name, f"timer {seconds:.1f}s")
            except Exception as err:
                self.errors.append(f"timer kill of {name or '*'}: {type(err).__name__}: {err}")

        timer = threading.Timer(seconds, fire)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def restore(self) -> None:
        """Start every killed server again once its down time is over; return when all are
        up. Idempotent: a server that is up is left alone."""
        with self._lock:
            down = dict(self._down_until)
        for name, until in down.items():
            wait = until - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not self.targets[name].running():
                self.targets[name].start()
                _log.warning("target %s started again", name)
            with self._lock:
                self._down_until.pop(name, None)
                self.kills = [
                    k if k.target != name or k.restarted_at is not None else _up(k)
                    for k in self.kills
                ]

    # -- serving ------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                for entry in sorted(self.state_dir.iterdir()):
                    if entry.name.endswith(TARGET_REQUEST):
                        self._answer(entry)
            self._stop.wait(self.poll_s)

    def _answer(self, request: Path) -> None:
        marker = str(request)[: -len(TARGET_REQUEST)]
        done = Path(marker + TARGET_DONE)
        if done.exists():
            return
        name = request.read_text().strip() or None
        failure = ""
        try:
            self.kill(name, f"fault {Path(marker).name}")
        except Exception as err:  # told to the firing process, which raises it
            failure = f"{type(err).__name__}: {err}"
            self.errors.append(failure)
        tmp = Path(str(done) + ".tmp")
        tmp.write_text(failure)
        tmp.replace(done)


def _up(kill: TargetKill) -> TargetKill:
    return TargetKill(kill.target, kill.at, kill.cause, time.time())
