"""Regenerate ``docs/images/metrics-dashboard.png``, the picture in ``docs/observability.md``.

Run from the repository root (about a minute; needs Debian's ``chromium`` package)::

    ./.venv/bin/python docs/images/make_metrics_screenshot.py

It streams 8 epochs into two files sinks in a local Spark session with one
``PrometheusMetrics(port=0)`` for every run of the query, a crash right after epoch 3's
decision (the restart's recovery commits it) and a pre-commit that fails twice in epoch 5
(that round is aborted; the restart's round commits). A thread scrapes the real endpoint
over HTTP every 0.2 s and parses it with ``prometheus_client.parser``, as Prometheus would;
the page draws the Grafana dashboard's main panels (``docs/grafana-dashboard.json``) from
those samples, and headless Chromium takes its picture at 1280 px wide.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA = "id long, key string, amount double, payload string"
Series = dict[str, list[tuple[float, float]]]

#: (title, unit, how to read the series of one scrape: {line label: value})
PANELS: list[tuple[str, str, Callable[[dict[str, float]], dict[str, float]]]] = [
    ("Epochs by outcome", "epochs", lambda m: _pick(m, "txsink_epochs_total", "outcome")),
    ("Rows written", "rows", lambda m: _pick(m, "txsink_written_rows_total", "sink_uid")),
    ("Handles by outcome", "handles", lambda m: _pick(m, "txsink_handles_total", "outcome")),
    (
        "Decided, not yet committed",
        "epochs",
        lambda m: _pick(m, "txsink_decided_uncommitted_epochs", None),
    ),
    ("Last committed epoch", "epoch", lambda m: _pick(m, "txsink_last_committed_epoch", None)),
    (
        "Lingering prepared transactions",
        "transactions",
        lambda m: _pick(m, "txsink_lingering_prepared_transactions", "sink_uid"),
    ),
]
COLORS = ["#1565c0", "#2e7d32", "#c62828", "#ef6c00", "#6a1b9a", "#00838f"]


def _pick(metrics: dict[str, float], name: str, by: str | None) -> dict[str, float]:
    """The samples of ``name``, summed by the label ``by`` (None: one line)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        metric, _, labels = key.partition("|")
        if metric != name:
            continue
        label = (
            name.removeprefix("txsink_")
            if by is None
            else dict(pair.split("=", 1) for pair in labels.split(",") if pair).get(by, "?")
        )
        out[label] = out.get(label, 0.0) + value
    return out


def scrape(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
        text = reply.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}|{labels}"] = float(sample.value)
    return found


def record(workdir: Path) -> list[tuple[float, dict[str, float]]]:
    """Run the pipeline; the scrapes of its endpoint, (seconds since start, samples)."""
    from pyspark.errors import StreamingQueryException

    from txsink import Coordinator, FaultPlan
    from txsink.connectors.files import FilesSink
    from txsink.observe.prometheus import PrometheusMetrics
    from txsink.spark.localspark import local_spark
    from txsink.testing.inputs import make_input

    spark = local_spark("local[2,2]", "txsink-docs")
    metrics = PrometheusMetrics(port=0)
    scrapes: list[tuple[float, dict[str, float]]] = []
    done = threading.Event()
    began = time.monotonic()

    def scraper() -> None:
        while not done.wait(0.2):
            scrapes.append((time.monotonic() - began, scrape(metrics.port)))

    thread = threading.Thread(target=scraper, daemon=True)
    try:
        make_input(workdir / "input", 8000, 8)
        plan = FaultPlan.parse(
            "after_decision:raise@3,before_precommit:raise@5#1*2", str(workdir / "faults")
        )
        thread.start()
        for _run in range(4):
            coordinator = Coordinator(
                [
                    FilesSink(workdir / "orders", uid="orders"),
                    FilesSink(workdir / "audit", uid="audit", format="jsonl"),
                ],
                log=str(workdir / "txlog"),
                app_id="orders-pipeline",
                faults=plan,
                metrics=metrics,
            )
            df = (
                spark.readStream.schema(SCHEMA)
                .option("maxFilesPerTrigger", 1)
                .parquet(str(workdir / "input"))
                .repartition(3)
            )
            query: Any = (
                df.writeStream.foreachBatch(coordinator)
                .option("checkpointLocation", str(workdir / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            try:
                query.awaitTermination()
                break
            except StreamingQueryException:
                time.sleep(1.0)  # a supervisor restarts the query
                continue
        time.sleep(0.5)
    finally:
        done.set()
        thread.join(5)
        spark.stop()
    return scrapes


def _panel(title: str, unit: str, series: Series, end: float) -> str:
    width, height, left, bottom = 600, 230, 48, 28
    top = max([v for points in series.values() for _, v in points] + [1.0])
    plot_w, plot_h = width - left - 10, height - bottom - 30

    def x(t: float) -> float:
        return left + plot_w * t / max(end, 1e-9)

    def y(v: float) -> float:
        return 30 + plot_h * (1 - v / top)

    parts = [
        f'<text x="{left}" y="18" font-size="14" font-weight="600">{html.escape(title)}</text>',
        f'<line x1="{left}" y1="{30 + plot_h}" x2="{left + plot_w}" y2="{30 + plot_h}" '
        'stroke="#999"/>',
        f'<text x="6" y="{y(top) + 4:.0f}" font-size="11" fill="#555">{top:g}</text>',
        f'<text x="6" y="{30 + plot_h}" font-size="11" fill="#555">0</text>',
        f'<text x="{left + plot_w - 60}" y="{height - 8}" font-size="11" fill="#555">'
        f"{end:.0f} s ({html.escape(unit)})</text>",
    ]
    for i, (label, points) in enumerate(sorted(series.items())):
        color = COLORS[i % len(COLORS)]
        path, last = [], None
        for t, v in points:
            if last is not None:
                path.append(f"L{x(t):.1f},{y(last):.1f}")  # a step: values change at scrapes
            path.append(("M" if last is None else "L") + f"{x(t):.1f},{y(v):.1f}")
            last = v
        parts.append(f'<path d="{" ".join(path)}" fill="none" stroke="{color}" stroke-width="2"/>')
        parts.append(
            f'<text x="{left + 8 + 120 * i}" y="{height - 8}" font-size="11" fill="{color}">'
            f"{html.escape(label)} = {last:g}</text>"
        )
    body = "".join(parts)
    return f'<svg width="{width}" height="{height}" font-family="sans-serif">{body}</svg>'


def render(scrapes: list[tuple[float, dict[str, float]]]) -> str:
    end = scrapes[-1][0] if scrapes else 1.0
    panels = []
    for title, unit, read in PANELS:
        series: Series = {}
        for t, metrics in scrapes:
            for label, value in read(metrics).items():
                series.setdefault(label, []).append((t, value))
        panels.append(f'<div class="panel">{_panel(title, unit, series, end)}</div>')
    return (
        "<!doctype html><html><head><meta charset='utf-8'><style>"
        "body{font-family:sans-serif;margin:16px;background:#fafafa}"
        ".grid{display:grid;grid-template-columns:620px 620px;gap:12px}"
        ".panel{background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px}"
        "</style></head><body><h2>txsink — app_id=orders-pipeline (Prometheus scrapes, "
        "crash after epoch 3's decision, epoch 5's pre-commit failing twice)</h2>"
        f'<div class="grid">{"".join(panels)}</div></body></html>'
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "metrics-dashboard.png"))
    parser.add_argument("--height", type=int, default=900, help="window height in pixels")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from make_inspect_screenshot import screenshot  # this folder's: Chromium at 1280 px

    with tempfile.TemporaryDirectory(prefix="txsink-docs-") as tmp:
        scrapes = record(Path(tmp))
        page = Path(tmp) / "metrics.html"
        page.write_text(render(scrapes))
        screenshot(page, Path(args.out), args.height)
    print(f"wrote {args.out} from {len(scrapes)} scrapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
