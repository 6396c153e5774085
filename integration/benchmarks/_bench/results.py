"""The results of one benchmark run: every timed run, and the numbers the report reads off
them (medians, rates, ratios against the natural alternative, CPU, the epoch's phases).

A benchmark subclasses :class:`Results`, names itself and its baseline in class
variables and adds the fields of its extras. Results are saved as JSON after every run, so
``--render`` can print (and write to the docs) an earlier run without measuring again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from .env import REPO
from .measure import Measurement, median

SAVED = REPO / "integration" / ".work" / "benchmarks"
PHASES = ("recover", "precommit", "decide", "commit")


@dataclass
class Results:
    """Every run of every writer, with what the report needs to read them.

    Class variables a benchmark sets: ``name`` (its section in docs/benchmarks.md, the
    prefix of the saved JSON, ``run <name>``), ``title`` (in log lines and help),
    ``server`` (the server's process tree in the CPU columns), ``baseline`` (the writer
    ratios are taken against unless said otherwise), ``after`` (the section a new section
    of the docs goes after; None: at the end) and ``from_args`` (option names whose values
    become fields of the same name).
    """

    name: ClassVar[str]
    title: ClassVar[str]
    server: ClassVar[str]
    baseline: ClassVar[str]
    after: ClassVar[str | None] = None
    from_args: ClassVar[tuple[str, ...]] = ()

    rows: int
    partitions: list[int]
    repeat: int
    runs: list[Measurement] = field(default_factory=list)
    uptime_before: str = ""
    uptime_after: str = ""
    started: str = ""
    minutes: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    machine: dict[str, str] = field(default_factory=dict)
    command: str = ""
    void: list[str] = field(default_factory=list)
    feed: str = "same"  # see .feed: "same" (the cap lifted for every writer) or "defaults"

    @property
    def section(self) -> str:
        """The section of docs/benchmarks.md: ``<name>``, or ``<name>-spark-defaults`` for
        the report with Spark's defaults (each feed has its own section)."""
        return self.name if self.feed == "same" else f"{self.name}-spark-defaults"

    @property
    def section_after(self) -> str | None:
        """The section this one goes after: the same-feed report's, for the defaults one."""
        return self.after if self.feed == "same" else self.name

    # -- reading the runs ------------------------------------------------------------------

    def of(self, writer: str, partitions: int) -> list[Measurement]:
        return [m for m in self.runs if m.writer == writer and m.partitions == partitions]

    def seconds(self, writer: str, partitions: int) -> list[float]:
        return [m.seconds for m in self.of(writer, partitions)]

    def rate(self, writer: str, partitions: int) -> float:
        """Rows per second at the median time."""
        secs = median(self.seconds(writer, partitions))
        return self.rows / secs if secs == secs and secs > 0 else float("nan")

    def ratio(self, writer: str, partitions: int, over: str | None = None) -> float:
        """``writer``'s rate over ``over``'s (default: the baseline's)."""
        return self.rate(writer, partitions) / self.rate(over or self.baseline, partitions)

    def paired(self, writer: str, partitions: int, over: str | None = None) -> list[float]:
        """``writer``'s rate over ``over``'s, run by run (each pair ran back to back)."""
        mine, theirs = (
            self.seconds(writer, partitions),
            self.seconds(over or self.baseline, partitions),
        )
        return [t / m for m, t in zip(mine, theirs, strict=False)]

    def ratio_at(self, writer: str, partitions: int, over: str | None = None) -> str:
        """The ratio with its run-by-run range, for the reading:
        ``1.03x at 2 partitions (single runs 0.98-1.05x)``."""
        runs = self.paired(writer, partitions, over)
        return (
            f"{self.ratio(writer, partitions, over):.2f}x at {partitions} partitions "
            f"(single runs {min(runs):.2f}-{max(runs):.2f}x)"
        )

    def straddles(self, writer: str, partitions: int, over: str | None = None) -> bool:
        """Whether ``writer`` was faster than ``over`` in some runs and slower in others:
        the gap between the medians is then within the run-to-run noise."""
        runs = self.paired(writer, partitions, over)
        return min(runs) <= 1.0 <= max(runs)

    def is_void(self, writer: str, partitions: int) -> bool:
        return any("void" in m.extra for m in self.of(writer, partitions))

    def cpu(self, writer: str, partitions: int) -> dict[str, float]:
        """Median CPU seconds per run: ``spark`` (this process tree), the server's, ``others``."""
        runs = self.of(writer, partitions)
        return {
            k: median([m.extra.get("cpu", {}).get(k, float("nan")) for m in runs])
            for k in ("spark", self.server, "others")
        }

    def ratio_range(
        self, writer: str, partitions: int, over: str | None = None
    ) -> tuple[float, float, float]:
        """(min, median, max) of ``writer``'s rate over ``over``'s, paired run by run
        (repeat ``i`` of one against repeat ``i`` of the other: they ran back to back)."""
        runs = self.paired(writer, partitions, over)
        if not runs:
            return (float("nan"),) * 3
        return (min(runs), median(runs), max(runs))

    def cpu_per_row(self, writer: str, partitions: int, role: str) -> float:
        """``role``'s CPU per row written, in microseconds (median over the runs)."""
        return cpu_per_row(self.of(writer, partitions), role)

    def phases(self, partitions: int, writer: str = "txsink") -> dict[str, float]:
        """Median seconds of the epoch's phases (``EpochResult.seconds``); ``other`` is the
        rest of the wall time (the sink's start-up checks, the schema, ...)."""
        runs = [m for m in self.of(writer, partitions) if "phases" in m.extra]
        out = {k: median([m.extra["phases"].get(k, 0.0) for m in runs]) for k in PHASES}
        out["other"] = median([m.seconds - sum(m.extra["phases"].values()) for m in runs])
        return out

    # -- saving and loading ----------------------------------------------------------------

    @classmethod
    def create(cls, args: Any, command: str) -> Self:
        """Empty results for a run with these options (``args`` from the benchmark's parser)."""
        extra = {name: getattr(args, name) for name in cls.from_args}
        feed = getattr(args, "feed", "same")
        return cls(args.rows, args.partitions, args.repeat, command=command, feed=feed, **extra)

    def encode(self) -> dict[str, Any]:
        """A JSON-able dict of the results (a benchmark with non-string keys overrides it)."""
        return dataclasses.asdict(self)

    @classmethod
    def decode(cls, doc: dict[str, Any]) -> dict[str, Any]:
        """The constructor's keyword arguments from :meth:`encode`'s dict, runs rebuilt."""
        doc["runs"] = [Measurement(**m) for m in doc["runs"]]
        return doc

    def save(self, folder: Path = SAVED) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
        path.write_text(json.dumps(self.encode(), indent=1, default=str))
        return path

    @classmethod
    def load(cls, path: Path) -> Self:
        return cls(**cls.decode(json.loads(path.read_text())))


def cpu_per_row(runs: Sequence[Measurement], role: str) -> float:
    """CPU microseconds per row (= CPU-seconds per million rows) that ``role`` (a role of
    :class:`~.cpu.CpuMeter`: ``spark``, ``jvm``, ``workers``, the server's name, ...)
    spent, median over ``runs``."""
    return median(
        [m.extra.get("cpu", {}).get(role, float("nan")) / m.rows * 1e6 for m in runs if m.rows]
    )
