"""The Data Source benchmark's results and report (the measuring is in ``datasource.py``;
this module only renders what a run saved)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

try:
    from benchmarks import _bench
    from benchmarks._bench.report import CPU_ROLES
except ImportError:  # run as a plain script
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench
    from benchmarks._bench.report import CPU_ROLES

WRITERS = ("foreachBatch", "datasource")
LABELS = {
    "foreachBatch": "foreachBatch(Coordinator([sink]))",
    "datasource": 'writeStream.format("txsink")',
}
#: The CPU roles of this benchmark's tables: the shared ones, and the Python workers the JVM
#: starts on the driver for a Data Source's planning and commit (their own role: the
#: foreachBatch path runs the same work in the driver's own process).
ROLES = (*CPU_ROLES, ("driver_workers", "driver-side Python workers"))
#: Start-up CPU by role, in the timing table: (role, short name).
START_ROLES = (("driver", "driver"), ("driver_workers", "driver-side"), ("jvm", "JVM"),
               ("workers", "workers"))  # fmt: skip
HEADING = "The Data Source path next to foreachBatch (start-up and per-epoch cost)"
CONNECTORS = {"files": "the files sink", "postgres": "PostgreSQL"}


@dataclass
class Results(_bench.Results):
    """One measurement per query: ``rows`` the rows of the epochs after the first,
    ``seconds`` from the end of the first epoch to the end of the last (both seen by the
    epoch listener); ``extra`` holds the CPU by role of that window (``cpu``) and of the
    start-up (``start_cpu``: from just before ``start()`` to the end of the first epoch),
    the start-up's seconds (``start_s``) and every later epoch's ``triggerExecution``
    (``epochs_s``)."""

    name: ClassVar[str] = "datasource"
    title: ClassVar[str] = "Data Source path"
    server: ClassVar[str] = "postgres"
    baseline: ClassVar[str] = "foreachBatch"
    from_args: ClassVar[tuple[str, ...]] = ("epochs", "connector")

    epochs: int = 0
    connector: str = "files"
    epoch_rows: int = 0

    @property
    def section(self) -> str:
        """``datasource`` (the files sink), ``datasource-postgres``; each with its
        ``-spark-defaults`` twin for ``--feed defaults``."""
        name = self.name + ("" if self.connector == "files" else f"-{self.connector}")
        return name if self.feed == "same" else f"{name}-spark-defaults"

    @property
    def section_after(self) -> str | None:
        """The files sink's section first, then PostgreSQL's, each then its defaults twin."""
        if self.feed != "same":
            return self.section.removesuffix("-spark-defaults")
        return None if self.connector == "files" else self.name

    def starts(self, writer: str, partitions: int) -> list[float]:
        """Seconds from ``start()`` to the end of the first epoch, one per query."""
        return [m.extra.get("start_s", float("nan")) for m in self.of(writer, partitions)]

    def epoch_medians(self, writer: str, partitions: int) -> list[float]:
        """The median seconds per epoch (Spark's ``triggerExecution``), one per query."""
        return [_bench.median(m.extra.get("epochs_s", [])) for m in self.of(writer, partitions)]

    def start_cpu(self, writer: str, partitions: int, role: str) -> float:
        """``role``'s CPU-seconds during the start-up, median over the queries."""
        runs = self.of(writer, partitions)
        return _bench.median([m.extra.get("start_cpu", {}).get(role, float("nan")) for m in runs])


def timing_table(res: Results) -> str:
    """Per partition count and path: start-up and ms per epoch (min / median / max over the
    repeats), their paired ratios Data Source / foreachBatch, the start-up's CPU by role."""
    rows = []
    for p in res.partitions:
        fb_start, fb_epoch = res.starts("foreachBatch", p), res.epoch_medians("foreachBatch", p)
        for w in WRITERS:
            if not res.of(w, p):
                continue
            start, epoch = res.starts(w, p), res.epoch_medians(w, p)
            cpu = [res.start_cpu(w, p, role) for role, _ in START_ROLES]
            rows.append(
                [
                    str(p),
                    LABELS[w] + (" VOID" if res.is_void(w, p) else ""),
                    _bench.min_median_max(start),
                    _bench.min_median_max(epoch, scale=1000, digits=0),
                    "" if w == res.baseline else _bench.paired_cell(start, fb_start),
                    "" if w == res.baseline else _bench.paired_cell(epoch, fb_epoch),
                    f"{sum(c for c in cpu if c == c):.2f}: "
                    + " / ".join("-" if c != c else f"{c:.2f}" for c in cpu),
                ]
            )
    headers = [
        "partitions",
        "path",
        "start-up s: median (min-max)",
        "ms per epoch: median (min-max)",
        "start-up time: Data Source / foreachBatch",
        "time per epoch: Data Source / foreachBatch",
        "start-up CPU-s: total: " + " / ".join(name for _, name in START_ROLES),
    ]
    return _bench.markdown_table(headers, rows, "rlrrrrr")


def _servers(res: Results) -> list[tuple[str, str]]:
    return [("postgres", "PostgreSQL")] if res.connector == "postgres" else []


def cpu_tables(res: Results) -> list[str]:
    """CPU by role per epoch and per 1M rows (the shared table, this benchmark's roles)."""
    servers = _servers(res)
    per_epoch = _bench.cpu_table(res, LABELS, WRITERS, over="foreachBatch", servers=servers,
                                 roles=ROLES, per=("per epoch", res.epoch_rows / 1e6))  # fmt: skip
    per_million = _bench.cpu_table(
        res, LABELS, WRITERS, over="foreachBatch", servers=servers, roles=ROLES
    )
    return [per_epoch, "The same, per million rows:", per_million]


def reading(res: Results) -> list[str]:
    """The numbers, read: generated from the results, so a rerun cannot contradict them."""
    out = []
    for p in res.partitions:
        ds, fb = res.of("datasource", p), res.of("foreachBatch", p)
        if not ds or not fb:
            continue
        start = _bench.paired_cell(res.starts("datasource", p), res.starts("foreachBatch", p))
        epoch = _bench.paired_cell(
            res.epoch_medians("datasource", p), res.epoch_medians("foreachBatch", p)
        )
        per = res.epoch_rows / 1e6

        def cpu(writer: str, role: str) -> float:
            return _bench.cpu_per_row(res.of(writer, p), role) * per  # noqa: B023

        driver_ds = cpu("datasource", "driver") + cpu("datasource", "driver_workers")
        out.append(
            f"**{p} partitions**: the Data Source path's start-up takes {start} foreachBatch's, "
            f"an epoch {epoch} (paired run by run: median (min-max) over {len(ds)} repeat(s)). "
            f"CPU per epoch, all of Spark: {cpu('datasource', 'spark'):.3f} s against "
            f"{cpu('foreachBatch', 'spark'):.3f} s; on the driver side (the driver's process "
            f"and the driver-side Python workers) {driver_ds:.3f} s against "
            f"{cpu('foreachBatch', 'driver') + cpu('foreachBatch', 'driver_workers'):.3f} s."
        )
    loads = [m.load_before for m in res.runs]
    cores = int(res.machine.get("cores", "0") or 0)
    if loads and cores and _bench.median(loads) > cores:
        out.append(
            f"**Noise**: the machine was busy (median load {_bench.median(loads):.1f} at the "
            f"start of a query on {cores} cores): read the CPU columns, not the times."
        )
    out.append(
        "**What each path pays** (see [datasource.md](datasource.md#what-runs-where)): the "
        "Data Source path starts a planning and a commit Python worker on the driver (reused "
        "across batches: the *driver-side Python workers* column), looks up installed data "
        "sources once per session, and per batch re-opens the log and runs recovery (the "
        "sink's `list_prepared`) at planning; `foreachBatch` runs the pre-commit as a "
        "separate `mapInArrow` job whose acks come back through `collect`, its coordinator "
        "in the driver's own process (*driver Python*), and recovers only before a run's "
        "first epoch."
    )
    return out


def _feed_line(res: Results) -> str:
    if res.feed == "same":
        return (
            "Which feed a user gets: both paths ran in one session with the cap lifted, so "
            "their tasks got the same feed. A user gets this feed on the foreachBatch path "
            "(txsink lifts the cap for its own job); on the Data Source path only if the "
            "session lifts it: Spark plans a Data Source's write, and txsink does not change "
            "the setting there (`--feed defaults` measures that)."
        )
    return (
        "Which feed a user gets: this one. The session keeps Spark's default byte cap, which "
        "the Data Source path's tasks run under; the foreachBatch path's job lifts it (txsink "
        "does that for its own jobs)."
    )


def render(res: Results) -> str:
    v, mach = res.versions, res.machine
    target = {
        "files": "the files sink on local disk, read back with `read_committed`",
        "postgres": "a fresh PostgreSQL table per query (no index), read back with psycopg "
        "(count, distinct ids) and no prepared transaction left",
    }[res.connector]
    parts = [
        *_bench.header(
            res,
            HEADING if res.connector == "files" else f"{HEADING}, {CONNECTORS[res.connector]}",
            "The load average counts the benchmark itself.",
        ),
        f"- Versions: PySpark {v.get('pyspark')} (`local[2]`, {mach.get('java')}), Python "
        f"{mach.get('python')}" + (f", psycopg {v['psycopg']}" if "psycopg" in v else "") + ".",
        f"- {_feed_line(res)}",
        f"- Each query streams {res.epochs} epochs of {res.epoch_rows:,} rows (one Parquet "
        "file per epoch, `maxFilesPerTrigger=1`, `trigger(availableNow=True)`, "
        f"`repartition(p)`) into {target}: **foreachBatch** "
        "`foreachBatch(Coordinator([sink], log=...))`, **Data Source** "
        '`writeStream.format("txsink").options(...)` with the same sink options. '
        f"{res.repeat} repeat(s), each running both paths (the order alternating), after "
        "untimed full-size queries of both (`--warmup`). Every target is read back: the rows "
        "must be exact.",
        "- *start-up*: from `start()` to the end of the first epoch (the query's start, the "
        "first planning, the first Python workers); *per epoch*: Spark's `triggerExecution` "
        "of each later epoch, the median per query, then min / median / max over the "
        "repeats. The ratios pair repeat *i* of one path with repeat *i* of the other (they "
        "ran back to back). CPU: from `/proc` at each epoch's progress event (a "
        "`StreamingQueryListener`), over the epochs after the first; the start-up's CPU "
        "(`start()` to the end of the first epoch) is in the timing table.",
        *_bench.blocks(timing_table(res), title="Start-up and per-epoch time"),
        *_bench.blocks(
            "CPU-seconds per epoch by role (median over the queries): the roles of the other "
            "sections, and *driver-side Python workers*: the workers Spark's JVM starts on the "
            "driver for a Data Source's planning and commit (and its data source lookup), "
            "which the foreachBatch path runs in *driver Python*. The rate ratio (rows per "
            "second over the epochs after the first, paired run by run) reads the other way "
            "round from the time ratios above: above 1 is faster.",
            *cpu_tables(res),
            title="CPU per epoch by role",
        ),
        *_bench.bullets("Reading", reading(res)),
    ]
    if res.void:
        parts += _bench.bullets("Void runs", res.void)
    return "\n".join(parts) + "\n"
