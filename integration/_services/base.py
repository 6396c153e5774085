"""What every local service shares: the pid it is known by, start (idempotent), stop,
health and status, so the manager treats them alike and a service says only what is its own.

A service names its process's command-line ``marker`` (so a recycled pid is never
signalled), says when it is ``healthy`` and which ``env`` points a test at it, and
implements ``start``: provision, pick its ports (:meth:`LocalService.assign_ports`) and
bring the server up, usually with :meth:`LocalService.launch` (spawn, pid file, wait until
healthy, the log's tail on failure). ``up``, ``down`` and ``running`` are done here.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from .common import (
    ServiceError,
    StartReport,
    choose_port,
    claim_ports,
    ensure_dirs,
    log,
    pid_alive,
    read_pid,
    spawn,
    stop_pid,
    tail_file,
    wait_until,
    write_pid,
)


class LocalService(ABC):
    """One server process on 127.0.0.1, with its state kept in ``.work/state.json``.

    ``state`` is the service's own JSON-able dict (ports, pid marker, flavour); the manager
    stores it between runs so ``up`` can reuse ports and ``down`` can find the process.

    Class variables: ``name``; ``default_ports`` (state key -> documented port, taken when
    free); ``start_timeout`` (seconds to become healthy after the spawn); ``stop_timeout``
    (seconds from SIGTERM to SIGKILL); ``logs`` (files and line counts whose tails explain
    a failed start).
    """

    name: ClassVar[str]
    default_ports: ClassVar[Mapping[str, int]] = {}
    start_timeout: ClassVar[float] = 60.0
    stop_timeout: ClassVar[float] = 30.0
    logs: ClassVar[Sequence[tuple[Path, int]]] = ()

    # -- what a service says about itself ------------------------------------------------

    @abstractmethod
    def marker(self, state: dict[str, Any]) -> str:
        """A string in our server's command line: a pid without it is not ours."""

    @abstractmethod
    def healthy(self, state: dict[str, Any]) -> bool:
        """True if the server answers a real client request."""

    @abstractmethod
    def env(self, state: dict[str, Any]) -> dict[str, str]:
        """The TXSINK_* variables that point a test run at this server."""

    @abstractmethod
    def start(self, state: dict[str, Any], taken_ports: set[int], report: StartReport) -> None:
        """Provision and start the server (it is not running), update ``state`` in place and
        add what happened to ``report``; return once it is healthy."""

    def pid(self, state: dict[str, Any]) -> int | None:
        """Our server's pid, from the pid file ``start`` wrote."""
        return read_pid(self.name)

    def running_notes(self, state: dict[str, Any]) -> list[str]:
        """What ``up`` says about a server it found running (e.g. which flavour)."""
        return []

    def ports(self, state: dict[str, Any]) -> set[int]:
        """Ports this service holds (so others do not pick them)."""
        return {int(v) for k, v in state.items() if k.endswith("port") and isinstance(v, int)}

    # -- the life cycle, the same for every service ---------------------------------------

    def running(self, state: dict[str, Any]) -> bool:
        """True if our process is alive (not necessarily healthy)."""
        pid = self.pid(state)
        return pid is not None and pid_alive(pid, self.marker(state))

    def up(self, state: dict[str, Any], taken_ports: set[int]) -> StartReport:
        """Start the server if it is not running (idempotent) and update ``state`` in place.

        A server that runs but does not answer is stopped and started again.
        """
        t0 = time.monotonic()
        ensure_dirs()
        report = StartReport(self.name, {})
        if self.running(state) and self.healthy(state):
            report.already_running = True
            report.notes += self.running_notes(state)
            # Started before ports were claimed, or by another harness version: claim now.
            report.notes += claim_ports(self.ports(state))
        else:
            if self.running(state):
                log(f"{self.name}: running but not answering; restarting it")
                self.down(state)
            self.start(state, taken_ports, report)
        report.env = self.env(state)
        report.seconds = time.monotonic() - t0
        return report

    def down(self, state: dict[str, Any]) -> bool:
        """Stop the server by its pid (SIGTERM, then SIGKILL after ``stop_timeout``); True if
        something was stopped."""
        pid = self.pid(state)
        if pid is None:
            return False
        return stop_pid(pid, self.marker(state), timeout=self.stop_timeout)

    # -- helpers for ``start`` --------------------------------------------------------------

    def assign_ports(self, state: dict[str, Any], taken: set[int], report: StartReport) -> None:
        """Each of ``default_ports`` into ``state``: the default if free, else last run's,
        else any free port (said in the report)."""
        for key, default in self.default_ports.items():
            port = choose_port(default, state.get(key), taken)
            if port != default:
                report.notes.append(f"{key} {default} taken, using {port}")
            state[key] = port

    def launch(
        self,
        argv: Sequence[str],
        state: dict[str, Any],
        output: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        what: str | None = None,
    ) -> None:
        """Spawn the server detached (stdout and stderr to ``output``), write its pid file,
        wait until it is healthy and :meth:`warm_up` it. On failure the error carries the
        tails of ``logs``; ``what`` names the server in it (default: the service's name)."""
        proc = spawn(argv, output, env=env, cwd=cwd)
        write_pid(self.name, proc.pid)
        try:
            self.wait_healthy(state, lambda: proc.poll() is None, self.start_timeout, what)
            self.warm_up(state)
        except Exception as exc:
            tails = "".join(f"\n--- {path}:\n{tail_file(path, lines)}" for path, lines in self.logs)
            raise ServiceError(f"{what or self.name} did not start: {exc}{tails}") from exc

    def wait_healthy(
        self,
        state: dict[str, Any],
        alive: Callable[[], bool],
        timeout: float,
        what: str | None = None,
    ) -> None:
        """Poll :meth:`healthy` until true; fail early when ``alive()`` says it died."""
        wait_until(
            f"{what or self.name} health check", lambda: self.healthy(state), timeout, alive=alive
        )

    def warm_up(self, state: dict[str, Any]) -> None:
        """Anything to do once the new server is healthy, before the first test (no-op)."""
        return None
