"""Timing one run of one writer: wall clock, load, CPU by process tree, and the verdict.

Every benchmark times a writer the same way (:func:`timed_run`), voids a run whose output
is wrong the same way (:func:`void_if`) and logs it in the same shape (:func:`log_run`), so
the numbers of different benchmarks mean the same thing.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .cpu import CpuMeter


@dataclass
class Measurement:
    """One timed run of one writer."""

    writer: str
    partitions: int
    rows: int
    seconds: float
    load_before: float
    load_after: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def load1() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def uptime() -> str:
    """``uptime``'s line (falls back to the load averages)."""
    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...``; afterwards ``t[0]`` holds the wall-clock seconds."""
    out: list[float] = []
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - t0)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def task_rows(job: Any) -> int:
    """Collect a ``mapInArrow`` job whose tasks each yield ``rows``: the rows they saw."""
    return int(sum(r["rows"] for r in job.collect()))


def log(message: str) -> None:
    """Progress on stderr (stdout carries the result tables)."""
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


def timed_run(
    cpu: CpuMeter,
    writer: str,
    partitions: int,
    rows: int,
    write: Callable[[], dict[str, Any]],
) -> Measurement:
    """Run ``write`` once under the stopwatch; its dict becomes the measurement's ``extra``,
    with the CPU seconds per process tree during the run under ``cpu``.

    Only the write is timed: verifying the output comes after, outside the clock.
    """
    load_before = load1()
    cpu_before = cpu.snapshot()
    with stopwatch() as elapsed:
        extra = write()
    extra["cpu"] = cpu.delta(cpu_before, cpu.snapshot())
    return Measurement(writer, partitions, rows, elapsed[0], load_before, load1(), extra)


def output_problems(
    found: Sequence[Any], expected: Sequence[Any], rows: int, holds: str = "table holds"
) -> list[str]:
    """What is wrong with an output whose fingerprint (count, distinct ids, then column
    aggregates) is ``found`` where the source's is ``expected``: [] when nothing."""
    if tuple(found[:2]) != (rows, rows):
        return [f"{holds} {found[0]} rows, {found[1]} distinct ids (want {rows})"]
    if tuple(found) != tuple(expected):
        return [f"column aggregates differ: {found} != {expected}"]
    return []


def first_line(err: BaseException) -> str:
    """The exception's first line (and its Java cause's, for Spark's errors), for a log line."""
    text = str(err).strip()
    lines = text.splitlines() or [type(err).__name__]
    causes = [line for line in lines if line.startswith("Caused by:")]
    return f"{type(err).__name__}: {lines[0][:300]}" + (f" ({causes[-1][:300]})" if causes else "")


def void_if(problems: Sequence[str], m: Measurement, tag: str, void: list[str]) -> None:
    """Mark ``m`` void when its output check found ``problems``: the message goes into
    ``m.extra["void"]``, the benchmark's ``void`` list and the log."""
    if not problems:
        return
    message = f"VOID {m.writer} partitions={m.partitions} {tag}: " + "; ".join(problems)
    void.append(message)
    m.extra["void"] = message
    log(message)


def rounded(values: dict[str, float]) -> dict[str, float]:
    """The dict with its values to 2 decimals (for log lines)."""
    return {k: round(v, 2) for k, v in values.items()}


def log_run(
    m: Measurement, tag: str, *, width: int, unit: str = "rows/s", middle: str = "", tail: str = ""
) -> None:
    """The progress line of one run: time, rate, load, CPU and the epoch's phases.

    ``middle`` goes after the rate (e.g. bytes), ``tail`` at the end (e.g. read-back time).
    """
    extra = m.extra
    log(
        f"{m.writer:<{width}} P={m.partitions} {tag}: {m.seconds:7.2f} s  "
        f"{m.rows_per_s:,.0f} {unit}  {middle}"
        f"load {m.load_before:.2f}->{m.load_after:.2f}  cpu {rounded(extra['cpu'])}"
        + (f"  phases {rounded(extra['phases'])}" if "phases" in extra else "")
        + tail
    )


def rotated(writers: Sequence[str], rep: int) -> list[str]:
    """``writers`` rotated by ``rep`` places, so no writer always runs first."""
    shift = rep % len(writers) if writers else 0
    return [*writers[shift:], *writers[:shift]]


def swap_on_odd(writers: Sequence[str], rep: int, first: str, second: str) -> list[str]:
    """``writers`` in order, with ``first`` and ``second`` swapped on odd repetitions, so
    neither of the pair always runs first."""
    order = list(writers)
    if rep % 2 == 1 and first in order and second in order:
        i, j = order.index(first), order.index(second)
        order[i], order[j] = order[j], order[i]
    return order
