"""Run your own action at a crash point: a network fault exactly during pre-commit or commit.

A :class:`~txsink.protocol.faults.FaultPlan` crashes the pipeline at a named point. Some faults are
not crashes: cutting or stalling the network to one target *while* the protocol is at a
given step. :class:`PointHooks` pauses the pipeline at a crash point, runs a callback in
the test's process (cut a proxy, start a timer that heals it), and lets the pipeline go on::

    hooks = PointHooks(tmp / "hooks")
    hooks.at("during_commit", proxy.cut, epoch=1)
    with hooks:                                          # serves the callbacks
        coordinator = Coordinator(sinks, log=..., faults=hooks.plan())
        ...

The pause works wherever the point runs: in the driver, or in a Spark task's Python worker
(another process): the paused code creates a request file in the hooks folder and waits for
the answer file the serving thread writes after the callback returned. In local mode the
folder is shared; on a cluster it must be on a filesystem every executor shares. Each hook
fires once (an exclusive create claims it), like a fault.

This is a :class:`~txsink.protocol.faults.FaultPlan` subclass: the plan's own faults (``base``) fire
as usual after the hooks.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from txsink.protocol.faults import TASK_POINTS, CrashPoint, FaultPlan

__all__ = ["Hook", "HookPlan", "PointHooks", "plan_from_spec"]


@dataclass(frozen=True)
class Hook:
    """Where to pause: a crash point, optionally only at one epoch / partition."""

    point: CrashPoint
    epoch: int | None = None
    partition: int | None = None

    def __post_init__(self) -> None:
        if self.partition is not None and self.point not in TASK_POINTS:
            raise ValueError(f"hook {self.point}: a partition applies to task points only")

    def matches(self, point: CrashPoint, epoch: int, partition: int | None) -> bool:
        return (
            self.point is point
            and (self.epoch is None or self.epoch == epoch)
            and (self.partition is None or self.partition == partition)
        )


@dataclass(frozen=True)
class HookPlan(FaultPlan):
    """A fault plan that first pauses at its hooks until the serving process answers."""

    hooks: tuple[Hook, ...] = ()
    folder: str = ""
    wait_s: float = 120.0

    def fire(
        self,
        point: CrashPoint,
        *,
        epoch: int,
        partition: int | None = None,
        driver_pid: int | None = None,
        driver_host: str | None = None,
    ) -> None:
        for index, hook in enumerate(self.hooks):
            if hook.matches(point, epoch, partition) and self._claim_hook(index):
                self._wait(index, point, epoch, partition)
        super().fire(
            point,
            epoch=epoch,
            partition=partition,
            driver_pid=driver_pid,
            driver_host=driver_host,
        )

    def _claim_hook(self, index: int) -> bool:
        try:
            fd = os.open(_request(self.folder, index), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def _wait(self, index: int, point: CrashPoint, epoch: int, partition: int | None) -> None:
        where = f"epoch={epoch}" + (f" partition={partition}" if partition is not None else "")
        print(f"txsink: hook {index} at {point} {where}: paused", file=sys.stderr, flush=True)
        deadline = time.monotonic() + self.wait_s
        done = _done(self.folder, index)
        while not os.path.exists(done):
            if time.monotonic() > deadline:
                raise TimeoutError(f"hook {index} at {point} {where}: no answer in {self.wait_s}s")
            time.sleep(0.02)


def _request(folder: str, index: int) -> str:
    return os.path.join(folder, f"hook-{index:02d}.request")


def _done(folder: str, index: int) -> str:
    return os.path.join(folder, f"hook-{index:02d}.done")


class PointHooks:
    """Callbacks at crash points, served by a thread of this process (see the module doc)."""

    def __init__(self, folder: str | os.PathLike[str], *, poll_s: float = 0.02) -> None:
        self.folder = str(folder)
        self.poll_s = poll_s
        self._hooks: list[Hook] = []
        self._actions: list[Callable[[], object]] = []
        #: (hook index, wall-clock time its callback returned)
        self.fired: list[tuple[int, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def at(
        self,
        point: CrashPoint | str,
        action: Callable[[], object],
        *,
        epoch: int | None = None,
        partition: int | None = None,
    ) -> Hook:
        """Run ``action`` (in this process) when the pipeline reaches ``point``, once."""
        hook = Hook(CrashPoint(point), epoch, partition)
        self._hooks.append(hook)
        self._actions.append(action)
        return hook

    def plan(self, base: FaultPlan | None = None, *, wait_s: float = 120.0) -> HookPlan:
        """The plan to give the coordinator; ``base``'s faults fire after the hooks."""
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        if base is None:
            return HookPlan(
                (), str(Path(self.folder, "faults")), tuple(self._hooks), self.folder, wait_s
            )
        return HookPlan(base.faults, base.state_dir, tuple(self._hooks), self.folder, wait_s)

    def spec(self) -> dict[str, Any]:
        """The hooks as JSON, for a pipeline in another process
        (:func:`~txsink.testing.pipelines.run_stream`'s ``hooks``: :func:`plan_from_spec`)."""
        return {
            "folder": self.folder,
            "at": [[str(h.point), h.epoch, h.partition] for h in self._hooks],
        }

    def start(self) -> PointHooks:
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._serve, name="txsink-hooks", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> PointHooks:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _serve(self) -> None:
        answered: set[int] = set()
        while not self._stop.is_set():
            for index, action in enumerate(self._actions):
                if index in answered or not os.path.exists(_request(self.folder, index)):
                    continue
                answered.add(index)
                try:
                    action()
                except Exception as err:  # the paused pipeline must go on regardless
                    self.errors.append(f"hook {index}: {type(err).__name__}: {err}")
                self.fired.append((index, time.time()))
                with contextlib.suppress(OSError), open(_done(self.folder, index), "w"):
                    pass
            self._stop.wait(self.poll_s)


def plan_from_spec(spec: dict[str, Any], base: FaultPlan | None = None) -> HookPlan:
    """The plan of :meth:`PointHooks.spec` in the pipeline's process (its hooks keep their
    numbers, so the serving process answers them); ``base``'s faults fire after them."""
    folder = str(spec["folder"])
    hooks = tuple(Hook(CrashPoint(p), e, part) for p, e, part in spec.get("at", ()))
    if base is None:
        return HookPlan((), str(Path(folder, "faults")), hooks, folder)
    return HookPlan(base.faults, base.state_dir, hooks, folder)
