"""The cost of live metrics: many small epochs of one query with and without exporters, in
one run, interleaved.

    integration/benchmarks/run metrics [--rows 2000] [--epochs 40] [--repeat 1]
                                       [--partitions 2] [--feed same|defaults]

Small epochs into the files sink on local disk (the cheapest target, so that a fixed
per-epoch cost shows): one ``Coordinator`` per writer whose ``write(df, epoch=i)`` runs epoch
after epoch, as a stream does. Writers: **none** (no metrics), **prometheus**
(``PrometheusMetrics(port=0)``: the HTTP endpoint served on the driver and scraped over
HTTP after every epoch, as a Prometheus server would, on its own schedule, scrape it),
**otel** (``OTelMetrics()`` with the OpenTelemetry SDK configured and an in-memory
reader collecting after every epoch). The three take turns epoch by epoch, the order of each
round rotated (so drift in the machine's load, and whatever the first place in a round
costs, hits each the same); the first ``--warmup`` rounds are untimed. Each epoch is timed
and metered (CPU by role, ``_bench.cpu``) alone; the scrape or collect after it is metered
apart (the driver's CPU), outside the epoch's time. ``--repeat`` runs the measured rounds
again as a series of its own. Every output is read back: the rows must be exact.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

try:
    from benchmarks import _bench
except ImportError:  # run as a plain script: python integration/benchmarks/metrics.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench

from txsink import Coordinator
from txsink.connectors.files import FilesSink
from txsink.connectors.files.testing import verify_files

WRITERS = ("none", "prometheus", "otel")
LABELS = {"none": "none", "prometheus": "prometheus", "otel": "otel"}
HEADING = "Live metrics: the cost per epoch"


@dataclass
class Results(_bench.Results):
    """One measurement per writer and series (``--repeat``): ``rows`` and ``seconds`` of its
    measured epochs together, ``extra["cpu"]`` their CPU by role summed (a mean per epoch
    resolves below the kernel's 10 ms tick, a median of single epochs does not); every
    epoch's seconds (``epochs_s``), and the scrape or collect after each (``read_s``, and
    the driver's CPU seconds ``read_cpu``)."""

    name: ClassVar[str] = "metrics"
    title: ClassVar[str] = "Live metrics"
    server: ClassVar[str] = ""
    baseline: ClassVar[str] = "none"
    from_args: ClassVar[tuple[str, ...]] = ("epochs",)

    epochs: int = 0
    epoch_rows: int = 0

    def epoch_times(self, writer: str, partitions: int) -> list[float]:
        """Every measured epoch's seconds, series after series, round by round."""
        return [s for m in self.of(writer, partitions) for s in m.extra.get("epochs_s", [])]

    def per_epoch(self, writer: str, partitions: int, key: str, role: str = "") -> float:
        """Mean per epoch of ``extra[key]`` (a list) or, with ``role``, of its CPU role."""
        runs = self.of(writer, partitions)
        epochs = sum(len(m.extra.get("epochs_s", [])) for m in runs)
        if role:
            total = sum(m.extra.get(key, {}).get(role, 0.0) for m in runs)
        else:
            total = sum(sum(m.extra.get(key, [])) for m in runs)
        return total / epochs if epochs else float("nan")


def _writers(tmp: Path) -> dict[str, tuple[Coordinator, Callable[[], None]]]:
    """Each writer's coordinator, and what an outside reader does after each epoch."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from txsink.observe.otel import OTelMetrics
    from txsink.observe.prometheus import PrometheusMetrics

    def coordinator(name: str, metrics: Any) -> Coordinator:
        sink = FilesSink(tmp / name, uid=name)
        return Coordinator([sink], log=tmp / f"{name}-log", app_id=f"m-{name}", metrics=metrics)

    prom = PrometheusMetrics(port=0)
    reader = InMemoryMetricReader()
    otel = OTelMetrics(meter_provider=MeterProvider(metric_readers=[reader]))

    def scrape() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{prom.port}/metrics", timeout=5) as r:
            r.read()

    def collect() -> None:
        reader.get_metrics_data()

    return {
        "none": (coordinator("none", None), lambda: None),
        "prometheus": (coordinator("prometheus", prom), scrape),
        "otel": (coordinator("otel", otel), collect),
    }


def _sum(into: dict[str, float], add: dict[str, float]) -> None:
    for key, value in add.items():
        into[key] = into.get(key, 0.0) + value


def parser() -> _bench.BenchParser:
    def options(p: _bench.BenchParser) -> None:
        p.add_count("--epochs", 40, "measured epochs per writer and series (default 40)")

    return _bench.BenchParser(
        Results,
        __doc__,
        writers=WRITERS,
        server=None,
        unit="rows per epoch",
        rows=2_000,
        partitions="Spark partitions per epoch (one run each)",
        partitions_default="2",
        options=options,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return _bench.main(argv, parser(), Results, run, render)


def run(res: Results, args: argparse.Namespace) -> list[str]:
    """The rounds at every partition count: warm-up rounds, then ``--repeat`` series of
    ``--epochs`` rounds, each writer one epoch per round."""
    import opentelemetry.sdk.version as otel_version
    import prometheus_client
    import pyspark

    res.epoch_rows = args.rows
    res.rows = args.rows * args.epochs  # one measurement: a series of one writer
    res.versions = {
        "pyspark": pyspark.__version__,
        "opentelemetry-sdk": otel_version.__version__,
        "prometheus-client": getattr(prometheus_client, "__version__", "?"),
    }
    spark = _bench.spark_session(
        "txsink-bench-metrics", feed=args.feed, slots=max(2, *args.partitions)
    )
    cpu = _bench.CpuMeter({"spark": os.getpid()})
    void: list[str] = []
    try:
        for p in args.partitions:
            df = _bench.cached_frame(spark, args.rows, p, ["id", "cast(id AS string) AS payload"])
            with tempfile.TemporaryDirectory(prefix="txsink-bench-metrics-") as folder:
                void += _series(res, args, cpu, df, p, Path(folder))
            df.unpersist(blocking=True)
    finally:
        spark.stop()
    return void


@dataclass
class _Series:
    """One writer's measured epochs of one series, as they come."""

    cpu: dict[str, float] = field(default_factory=dict)
    epochs_s: list[float] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)
    read_cpu: list[float] = field(default_factory=list)


def _series(res: Results, args: argparse.Namespace, cpu: _bench.CpuMeter, df: Any, p: int,
            folder: Path) -> list[str]:  # fmt: skip
    """The warm-up rounds, then ``--repeat`` series of ``--epochs`` rounds into ``res``;
    the void runs' messages (an output that is not exact voids its writer)."""
    writers = _writers(folder)
    names = [w for w in WRITERS if w in args.writers]
    epoch = 0
    for _ in range(args.warmup):
        for name in names:
            _write(writers[name][0], df, epoch)
            writers[name][1]()
        epoch += 1
    for rep in range(args.repeat):
        runs = {w: _Series() for w in names}
        load_before = _bench.load1()
        for _ in range(args.epochs):
            for name in _bench.rotated(names, epoch):  # each writer takes each place in turn
                coordinator, read = writers[name]
                write = functools.partial(_write, coordinator, df, epoch)
                m = _bench.timed_run(cpu, name, p, args.rows, write)
                before = cpu.snapshot()
                with _bench.stopwatch() as read_s:
                    read()
                run = runs[name]
                _sum(run.cpu, m.extra["cpu"])
                run.epochs_s.append(m.seconds)
                run.read_s.append(read_s[0])
                run.read_cpu.append(cpu.delta(before, cpu.snapshot()).get("driver", 0.0))
            epoch += 1
        for name, run in runs.items():
            rows, extra = args.rows * args.epochs, dataclasses.asdict(run)
            m = _bench.Measurement(
                name, p, rows, sum(run.epochs_s), load_before, _bench.load1(), extra
            )
            res.runs.append(m)
            _bench.log_run(m, f"p{p} series {rep}", width=10)
    void: list[str] = []
    for name in names:
        written = verify_files(folder / name, [], uid=name).rows_written
        if written != args.rows * epoch:
            message = (
                f"VOID {name} partitions={p}: read back {written} rows, not {args.rows * epoch}"
            )
            void.append(message)
            for m in res.of(name, p):
                m.extra["void"] = message
    return void


def _write(coordinator: Coordinator, df: Any, epoch: int) -> dict[str, Any]:
    result = coordinator.write(df, epoch=epoch)
    if result.status != "committed":
        raise RuntimeError(f"epoch {epoch} not committed: {result}")
    return {}


# -- the report ----------------------------------------------------------------------------


def timing_table(res: Results) -> str:
    """Per writer: ms per epoch (min / median / max over the epochs), the paired time ratio
    over *none* per round, the difference of the medians, the driver's CPU per epoch and
    its difference over *none*, and the scrape or collect after each epoch."""
    rows = []
    for p in res.partitions:
        base = res.epoch_times("none", p)
        base_driver = res.per_epoch("none", p, "cpu", "driver")
        for w in WRITERS:
            times = res.epoch_times(w, p)
            if not times:
                continue
            driver = res.per_epoch(w, p, "cpu", "driver")
            rows.append(
                [
                    str(p),
                    LABELS[w] + (" VOID" if res.is_void(w, p) else ""),
                    _bench.min_median_max(times, scale=1000, digits=1),
                    "" if w == "none" else _bench.paired_cell(times, base, digits=3),
                    ""
                    if w == "none"
                    else f"{(_bench.median(times) - _bench.median(base)) * 1000:+.1f}",
                    f"{driver * 1000:.1f}",
                    "" if w == "none" else f"{(driver - base_driver) * 1000:+.1f}",
                    ""
                    if w == "none"
                    else f"{res.per_epoch(w, p, 'read_s') * 1000:.1f} / "
                    f"{res.per_epoch(w, p, 'read_cpu') * 1000:.1f}",
                ]
            )
    headers = [
        "partitions",
        "metrics",
        "ms per epoch: median (min-max)",
        "time vs none, per round: median (min-max)",
        "vs none, ms (medians)",
        "driver CPU-ms per epoch (mean)",
        "driver CPU vs none, ms",
        "scrape / collect after each epoch: ms / driver CPU-ms (mean)",
    ]
    return _bench.markdown_table(headers, rows, "rlrrrrrr")


def reading(res: Results) -> list[str]:
    """The numbers, read: generated from the results, so a rerun cannot contradict them."""
    out = []
    for p in res.partitions:
        base = res.epoch_times("none", p)
        for w in ("prometheus", "otel"):
            times = res.epoch_times(w, p)
            if not times or not base:
                continue
            ratios = [t / b for t, b in zip(times, base, strict=False)]
            straddles = min(ratios) <= 1.0 <= max(ratios)
            driver = res.per_epoch(w, p, "cpu", "driver") - res.per_epoch(
                "none", p, "cpu", "driver"
            )
            out.append(
                f"**{w}** at {p} partitions: {_bench.paired_cell(times, base, digits=3)} the time "
                "of an epoch without metrics (per round: median (min-max))"
                + (
                    ", faster in some rounds and slower in others: within the noise"
                    if straddles
                    else ""
                )
                + f"; the driver's CPU per epoch {driver * 1000:+.1f} ms against none."
            )
    loads = [m.load_before for m in res.runs]
    cores = int(res.machine.get("cores", "0") or 0)
    if loads and cores and _bench.median(loads) > cores:
        out.append(
            f"**Noise**: the machine was busy (median load {_bench.median(loads):.1f} on {cores} "
            "cores): the times move with it; the driver's CPU per epoch is the figure to read."
        )
    out.append(
        "**Where the metrics run**: on the driver, from what the protocol already holds (acks, "
        "handles, phase timings); nothing runs in the tasks. So a cost would show in the "
        "driver's CPU per epoch first; the scrape or collect runs on the exporter's own "
        "schedule (here after every epoch, far more often than a Prometheus server or an "
        "OpenTelemetry periodic reader would), outside the epoch."
    )
    return out


def render(res: Results) -> str:
    v, mach = res.versions, res.machine
    parts = [
        *_bench.header(res, HEADING, "The load average counts the benchmark itself."),
        f"- Versions: PySpark {v.get('pyspark')} (`local[2]`, {mach.get('java')}), Python "
        f"{mach.get('python')}, opentelemetry-sdk {v.get('opentelemetry-sdk')}, "
        f"prometheus-client {v.get('prometheus-client')}.",
        f"- {res.repeat} series of {res.epochs} epochs of {res.epoch_rows:,} rows per writer "
        "into the files sink on local disk (the cheapest target, so that a fixed per-epoch "
        "cost would show), one `Coordinator` per writer running epoch after epoch as a "
        "stream does; the writers take turns epoch by epoch, each round's order rotated, "
        "after untimed warm-up rounds (`--warmup`). **prometheus**: `PrometheusMetrics("
        "port=0)`, its endpoint scraped over HTTP after every epoch; **otel**: `OTelMetrics` "
        "with the OpenTelemetry SDK and an in-memory reader collected after every epoch. "
        "Every output read back exactly.",
        "- Each epoch is timed and metered alone; the time ratio pairs the writer's epoch "
        "with *none*'s of the same round. CPU per epoch is the mean over the epochs (the "
        "kernel counts 10 ms ticks: a mean over many epochs resolves below one).",
        *_bench.blocks(timing_table(res), title="Time and the driver's CPU per epoch"),
        *_bench.blocks(
            "CPU-seconds per epoch by role (the mean over the epochs), the roles of the other "
            "sections; the rate ratio is rows per second over *none*'s (above 1: faster).",
            _bench.cpu_table(
                res, LABELS, WRITERS, over="none", per=("per epoch", res.epoch_rows / 1e6)
            ),
            title="CPU per epoch by role",
        ),
        *_bench.bullets("Reading", reading(res)),
    ]
    if res.void:
        parts += _bench.bullets("Void runs", res.void)
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
