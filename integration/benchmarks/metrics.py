"""The cost of live metrics: many small epochs of one query with and without exporters, in
one run, interleaved.

    integration/benchmarks/run metrics [--rows 2000] [--epochs 40] [--partitions 2]

Small epochs into the files sink on local disk (the cheapest target, so that a fixed
per-epoch cost shows): one ``Coordinator`` per writer whose ``write(df, epoch=i)`` runs epoch
after epoch, as a stream does. Writers: **none** (no metrics), **prometheus**
(``PrometheusMetrics(port=0)``: the HTTP endpoint served on the driver and scraped over
HTTP after every epoch, as a Prometheus server would, on its own schedule, scrape it),
**otel** (``OTelMetrics()`` with the OpenTelemetry SDK configured and an in-memory
reader collecting after every epoch). The three take turns epoch by epoch, the order of each
round rotated (so drift in the machine's load, and whatever the first place in a round
costs, hits each the same); the first round is a warm-up. Every
output is read back: the rows must be exact; the Prometheus counters must equal them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    from benchmarks import _bench
except ImportError:  # run as a plain script: python integration/benchmarks/metrics.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench

from txsink import Coordinator
from txsink.connectors.files import FilesSink
from txsink.connectors.files.testing import verify_files

WRITERS = ("none", "prometheus", "otel")


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000, help="rows per epoch")
    parser.add_argument("--epochs", type=int, default=40, help="epochs per writer (1st: warm-up)")
    parser.add_argument("--partitions", type=int, default=2, help="Spark partitions per epoch")
    _bench.add_feed_option(parser)
    args = parser.parse_args(argv)
    spark = _bench.spark_session(
        "txsink-bench-metrics", feed=args.feed, slots=max(2, args.partitions)
    )
    df = spark.range(args.rows).selectExpr("id", "cast(id AS string) AS payload")
    df = df.repartition(args.partitions).cache()
    df.count()
    seconds: dict[str, list[float]] = {w: [] for w in WRITERS}
    with tempfile.TemporaryDirectory(prefix="txsink-bench-metrics-") as folder:
        tmp = Path(folder)
        writers = _writers(tmp)
        for epoch in range(args.epochs):
            shift = epoch % len(WRITERS)  # each writer takes each place in the round in turn
            for name in WRITERS[shift:] + WRITERS[:shift]:
                coordinator, read = writers[name]
                t0 = time.perf_counter()
                coordinator.write(df, epoch=epoch)
                seconds[name].append(time.perf_counter() - t0)
                read()
        ok = {
            w: verify_files(tmp / w, [], uid=w).rows_written == args.rows * args.epochs
            for w in WRITERS
        }
    spark.stop()
    base = _bench.median(seconds["none"][1:])
    rows = [
        [
            w,
            _bench.ms(s[1:], digits=1),
            _bench.spread(s[1:]),
            f"{(_bench.median(s[1:]) - base) * 1000:+.1f}",
            f"{_bench.median(s[1:]) / base:.3f}x",
            "ok" if ok[w] else "WRONG",
        ]
        for w, s in seconds.items()
    ]
    print(
        f"\n{args.epochs} epochs of {args.rows:,} rows per writer, {args.partitions} "
        "partitions, files sink, writers interleaved epoch by epoch (first round: warm-up)\n"
    )
    print(
        _bench.markdown_table(
            ["metrics", "ms per epoch (median)", "range", "vs none, ms", "vs none", "read back"],
            rows,
            "lrrrrl",
        )
    )
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
