"""Disturbances that are not crashes: a second live driver, and a poison record.

Faults (:mod:`txsink.protocol.faults`) kill or fail something at a crash point. Two failures of
production are of another kind, and a chaos run can add either to a pipeline:

- **A second driver** (:class:`SecondDriver`): an operator (or a scheduler that lost
  track) starts the same query again, on the same checkpoint and txsink log, while the
  first one runs. The second must be refused before it touches anything, and the first
  must not notice: it finishes in the run it is in, with no restart. So that the second
  surely meets a live first (a second driver takes ~10 s to start Spark, a test query's
  epochs take less), the first's Python driver is held (``SIGSTOP``) from an epoch's
  commit until the second has ended, at most :data:`HOLD_S`: a pause well inside its
  lease, as a long garbage collection would be. Its JVM runs on, so Spark's own
  checkpoint moves as it would.
- **A poison record** (:class:`Poison`): one row of one input epoch that a target refuses
  deterministically (a connector's testing adapter says which rows, and under which
  options: :attr:`~txsink.testing.adapter.ConnectorTesting.poison`). The epoch must be
  refused before its decision, so nothing of it is visible in any target; the operator
  then fixes the input (the run rewrites that row) and restarts, and everything lands
  exactly once.

Both are drawn with the plan's seed (:func:`draw`), so a soak replays the same ones.
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from txsink.observe.logs import one_line
from txsink.runner import FAILED_LINE, RunReport, describe_exit

__all__ = [
    "REFUSALS",
    "Disturbed",
    "Poison",
    "SecondDriver",
    "draw",
    "heal_input",
    "poison_input",
]

#: How a second driver's refusal reads in its output: txsink's lease error, or Spark's
#: own refusal of a concurrent run of one checkpoint (both: nothing was touched).
REFUSALS: tuple[str, ...] = (
    "DriverLeaseError",
    "another driver",
    "CONCURRENT_STREAM_LOG_UPDATE",
    "ConcurrentModificationException",
)


#: The longest the first driver is held while a second one starts: well inside any lease
#: (a driver renews its lease several times a lease), so the first stays the live holder.
HOLD_S = 20.0


@dataclass(frozen=True)
class SecondDriver:
    """Start the same query again once the first run committed epoch ``after_epoch``; it
    runs once (no restart), with no fault, while the first is held (module doc)."""

    after_epoch: int

    def __str__(self) -> str:
        return f"second-driver@{self.after_epoch}"


@dataclass(frozen=True)
class Poison:
    """Row ``row`` (its index in the epoch's input file) of input epoch ``epoch`` gets a
    payload of ``size`` characters, over what connector ``connector`` accepts."""

    epoch: int
    row: int
    size: int
    connector: str

    def __str__(self) -> str:
        return f"poison={self.connector}@{self.epoch}#{self.row}:{self.size}B"


def draw(
    seed: int,
    epochs: int,
    *,
    two_drivers: float,
    poison: float,
    poison_limits: dict[str, int],
    rows_per_epoch: int,
) -> SecondDriver | Poison | None:
    """Whether a plan is a two-driver plan, a poison plan or neither, drawn with its seed.

    ``two_drivers`` and ``poison`` are the chances; ``poison_limits``: connector -> the
    payload length its target refuses above (only these can be poisoned; none: no poison
    plan). A generator of its own (seeded from ``seed``), so a soak with both chances at
    0 draws exactly the fault plans it drew before they existed.
    """
    if two_drivers <= 0 and poison <= 0:
        return None
    rng = random.Random(seed ^ 0xD15C)  # noqa: S311 - a reproducible plan, not a secret
    roll = rng.random()
    if roll < two_drivers and epochs >= 2:
        return SecondDriver(rng.randrange(epochs - 1))
    if roll < two_drivers + poison and poison_limits:
        connector = rng.choice(sorted(poison_limits))
        return Poison(
            epoch=rng.randrange(epochs),
            row=rng.randrange(max(1, rows_per_epoch)),
            size=2 * poison_limits[connector],
            connector=connector,
        )
    return None


def _file(folder: Path, epoch: int) -> Path:
    files = sorted(
        (p for p in folder.iterdir() if p.suffix == ".parquet"),
        key=lambda p: (p.stat().st_mtime, p.name),
    )
    return files[epoch]


def _rewrite(folder: str | os.PathLike[str], poison: Poison, payload: Any) -> None:
    """Replace one row's payload in place, keeping the file's name and modification time:
    Spark's file source then reads the same file as the same epoch, with the new row."""
    path = _file(Path(folder), poison.epoch)
    stat = path.stat()
    table = pq.read_table(path)
    row = min(poison.row, table.num_rows - 1)
    values = table.column("payload").to_pylist()
    values[row] = payload(values[row])
    index = table.schema.get_field_index("payload")
    table = table.set_column(index, "payload", pa.array(values, pa.string()))
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    os.utime(path, (stat.st_atime, stat.st_mtime))


def poison_input(folder: str | os.PathLike[str], poison: Poison) -> None:
    """Make the poisoned row's payload ``poison.size`` characters (the row keeps its id).

    Characters that do not compress (base64 of seeded random bytes: any codec keeps at
    least 3/4 of them): a target that limits compressed sizes (a Kafka topic, with the
    producer's lz4) must still refuse a payload of twice its limit."""
    rng = random.Random(poison.epoch * 1_000_003 + poison.row)  # noqa: S311 - test data
    noise = base64.b64encode(rng.randbytes(poison.size)).decode()
    _rewrite(folder, poison, lambda old: (old + noise)[: poison.size])


def heal_input(folder: str | os.PathLike[str], poison: Poison) -> None:
    """The operator's fix: the row's payload as :func:`~txsink.testing.make_input` wrote
    it (``event-<id>``, its first 15 characters)."""
    _rewrite(folder, poison, lambda old: old[:15])


class Disturbed:
    """A chaos run's disturbance while it runs, then its judgement (:mod:`~txsink.testing.chaos`).

    Call :meth:`start` before the first run, :meth:`on_start` with each run's process,
    :meth:`on_line` with every line of the pipeline (and the epochs committed so far),
    :meth:`on_restart` before each restart, :meth:`stop` when the runs are over (always),
    then :meth:`judge`. ``notes`` says what happened; ``violations`` where it was not
    handled as it must be.
    """

    def __init__(
        self,
        disturbance: SecondDriver | Poison | None,
        *,
        command: Sequence[str],
        env: Mapping[str, str],
        input_dir: Path,
        timeout: float,
        say: Callable[[str], None],
    ) -> None:
        self.disturbance = disturbance
        self._command = list(command)
        self._env = dict(env)
        self._input = input_dir
        self._timeout = timeout
        self._say = say
        self.notes: list[str] = []
        self.violations: list[str] = []
        self._first: subprocess.Popen[str] | None = None
        self._second: subprocess.Popen[str] | None = None
        self._second_out: list[str] = []
        self._watch: threading.Thread | None = None
        self._lock = threading.Lock()
        self._held = False
        self._stopped = False
        self._failure: str | None = None  # the failure line of the run that just ended
        self._healed = False

    # -- while it runs -------------------------------------------------------------------

    def start(self) -> None:
        if isinstance(self.disturbance, Poison):
            poison_input(self._input, self.disturbance)
            self._say(f"chaos: {self.disturbance}: input epoch {self.disturbance.epoch} poisoned")

    def on_start(self, proc: subprocess.Popen[str]) -> None:
        self._first = proc

    def on_line(self, line: str, committed: set[int]) -> None:
        if line.startswith(FAILED_LINE):
            self._failure = line.removeprefix(FAILED_LINE)
        second = self.disturbance
        if not isinstance(second, SecondDriver) or self._watch is not None:
            return
        if second.after_epoch in committed:  # the first driver runs and holds the query
            self._watch = threading.Thread(target=self._second_driver, name="chaos-second")
            self._watch.daemon = True
            self._watch.start()

    def fixable(self) -> bool:
        """Whether the run that just ended on an error a restart cannot help met the
        poison, which :meth:`on_restart` then fixes as an operator would (a restart after
        that is worth it); any other such error ends the chaos run."""
        return isinstance(self.disturbance, Poison) and not self._healed

    def on_restart(self) -> None:
        poison = self.disturbance
        failure, self._failure = self._failure, None
        if not isinstance(poison, Poison) or self._healed:
            return
        self.notes.append(f"refused: {one_line(failure or '(no failure line)', 300)}")
        if failure is None or f"epoch {poison.epoch} aborted" not in failure:
            self.violations.append(
                f"the poison row of epoch {poison.epoch} was not refused before the "
                f"decision: {one_line(failure or 'the run ended without a failure line', 300)}"
            )
        heal_input(self._input, poison)  # the operator's fix, before the restart
        self._healed = True
        self._say(f"chaos: {poison}: input fixed, restarting")

    def _second_driver(self) -> None:
        """Hold the first driver, run the second to its end, release the first."""
        with self._lock:
            if self._stopped:
                return
            self._hold(True)
            self._say(f"chaos: {self.disturbance}: first driver held, starting a second one")
            self._second = second = subprocess.Popen(
                self._command,
                env=self._env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
            )
        release = threading.Timer(HOLD_S, self._release)
        release.daemon = True
        release.start()
        try:
            for raw in second.stdout or ():
                self._second_out.append(raw.rstrip("\n"))
            second.wait()
        finally:
            release.cancel()
            self._release()

    def _release(self) -> None:
        with self._lock:
            self._hold(False)

    def _hold(self, held: bool) -> None:
        """SIGSTOP / SIGCONT the first driver's Python process (not its JVM)."""
        first = self._first
        if first is None or first.poll() is not None or held == self._held:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(first.pid, signal.SIGSTOP if held else signal.SIGCONT)
        self._held = held

    def stop(self) -> None:
        """The runs are over: end the second driver (bounded wait) and release the first."""
        with self._lock:
            self._stopped = True
            second = self._second
        if second is not None:
            try:
                second.wait(self._timeout)
            except subprocess.TimeoutExpired:
                second.kill()
                second.wait()
        if self._watch is not None:
            self._watch.join(30)
        self._release()

    # -- afterwards ----------------------------------------------------------------------

    def judge(self, runner: RunReport) -> None:
        """Whether the disturbance was handled: see the module doc."""
        if isinstance(self.disturbance, Poison):
            if not self._healed:
                self.violations.append(
                    f"the poison row of epoch {self.disturbance.epoch} was never refused: "
                    "a target took a row it must refuse, or the run never reached it"
                )
            return
        if not isinstance(self.disturbance, SecondDriver):
            return
        second = self._second
        if second is None:
            self.notes.append("the second driver never started (the first ended before)")
            return
        code = second.returncode
        said = next((ln for ln in reversed(self._second_out) if ln.startswith(FAILED_LINE)), "")
        refused = any(marker in "\n".join(self._second_out) for marker in REFUSALS)
        self.notes.append(
            f"second driver: {describe_exit(code)}"
            + (f", {one_line(said.removeprefix(FAILED_LINE), 200)}" if said else "")
        )
        if code != 0 and not refused:
            self.violations.append(
                "the second driver was not refused as a second driver: "
                + one_line(said or "\n".join(self._second_out[-3:]), 300)
            )
        if runner.runs > 1:
            self.violations.append(
                f"the first driver was disturbed: it needed {runner.runs} runs "
                f"({'; '.join(e for e in runner.endings if e)[:300]})"
            )
