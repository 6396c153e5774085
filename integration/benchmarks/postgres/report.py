"""The Postgres benchmark's results and their tables (throughput, the targets, the task
profile, the wide table)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from benchmarks import _bench
from typing_extensions import override

WIDE_WRITERS = ("txsink", "staging", "txsink_struct", "binary", "jdbc")

WRITERS = ("txsink", "staging", "upsert", "copy", "binary", "jdbc", "executemany")
LABELS = {
    "txsink": "txsink PostgresSink (2PC)",
    "staging": "txsink staging commit (no 2PC)",
    "txsink_struct": "txsink, attrs a struct",
    "upsert": "txsink upsert (key id)",
    "copy": "plain CSV COPY (no 2PC)",
    "binary": "plain binary COPY (no 2PC)",
    "jdbc": "Spark JDBC writer",
    "executemany": "psycopg executemany",
    "feed": "(Spark feed only, no DB)",
}
# txsink over each: CSV COPY stands in for txsink's CSV path of before (it ran at 0.94-1.03x
# plain CSV COPY), so ">= 1.25x today's txsink" reads ">= 1.25x plain CSV COPY" here.
TARGETS = {"copy": 1.25, "binary": 0.9, "jdbc": 1.5}
# The staging commit (commit="staging", issue #39) over each.
STAGING_TARGETS = {"binary": 0.7, "jdbc": 1.5}
# Where the last CSV-path run left txsink (docs/benchmarks.md, 2026-11-22, median of 5).
CSV_TXSINK_RATE = {2: 327_312, 8: 266_959}


@dataclass
class Results(_bench.Results):
    """The runs, plus the extras: task profiles, small epochs, 2PC latency, single
    connection, and the wide table's runs."""

    name: ClassVar[str] = "postgres"
    title: ClassVar[str] = "Postgres"
    server: ClassVar[str] = "postgres"
    baseline: ClassVar[str] = "copy"

    profiles: dict[int, dict[str, float]] = field(default_factory=dict)
    epochs: dict[int, dict[str, float]] = field(default_factory=dict)
    epoch_rows: int = 0
    tpc: dict[str, float] = field(default_factory=dict)
    single: dict[str, float] = field(default_factory=dict)
    wide_rows: int = 0
    wide: list[_bench.Measurement] = field(default_factory=list)
    wide_partitions: int = 0

    @classmethod
    @override
    def decode(cls, doc: dict[str, Any]) -> dict[str, Any]:
        doc = super().decode(doc)
        doc["wide"] = [_bench.Measurement(**m) for m in doc.get("wide", [])]
        doc.pop("binary", None)
        doc.pop("binary_rows", None)
        doc.pop("binary_partitions", None)
        doc["profiles"] = {int(k): v for k, v in doc["profiles"].items()}
        doc["epochs"] = {int(k): v for k, v in doc["epochs"].items()}
        return doc


def throughput_table(res: Results) -> str:
    return _bench.throughput_table(
        res,
        LABELS,
        (*WRITERS, "feed"),
        WRITERS,
        rate_header="rows/s (median)",
        vs_header="vs plain CSV COPY",
        server_header="PG",
        columns=[
            ("PG CPU µs/row", "r", lambda w, p, runs: f"{_bench.cpu_per_row(runs, 'postgres'):.2f}")
        ],
    )


def target_table(res: Results) -> str:
    rows = []
    for p in res.partitions:
        before = CSV_TXSINK_RATE.get(p)
        now = res.rate("txsink", p) if res.seconds("txsink", p) else float("nan")
        rows.append(
            [str(p)]
            + [
                _bench.ratio_cell(res, "txsink", p, writer, target=target)
                if res.seconds(writer, p)
                else "not run"
                for writer, target in TARGETS.items()
            ]
            + [f"{now / before:.2f}x" if before else "n/a"]
        )
    return _bench.markdown_table(
        [
            "partitions",
            "txsink / plain CSV COPY (target >= 1.25x)",
            "txsink / plain binary COPY (target >= 0.9x)",
            "txsink / Spark JDBC (target >= 1.5x)",
            "txsink / its CSV path's rate of 2026-11-22 (other load)",
        ],
        rows,
        "rrrrr",
    )


def staging_table(res: Results) -> str:
    """The staging commit against plain binary COPY, Spark JDBC and the two-phase commit; the
    driver's move (its commit phase) and the server's CPU per row of both commits."""
    rows = []
    for p in res.partitions:
        if not res.seconds("staging", p):
            continue
        cells = [
            _bench.ratio_cell(res, "staging", p, writer, target=target)
            if res.seconds(writer, p)
            else "not run"
            for writer, target in STAGING_TARGETS.items()
        ]
        two_pc = _bench.ratio_cell(res, "staging", p, "txsink") if res.seconds("txsink", p) else "-"
        moves = [m.extra["phases"].get("commit", 0.0) for m in res.of("staging", p)]
        rows.append(
            [str(p), *cells, two_pc, _bench.fmt_secs(moves)]
            + [f"{res.cpu_per_row(w, p, 'postgres'):.2f}" for w in ("staging", "txsink")]
        )
    return _bench.markdown_table(
        [
            "partitions",
            f"staging / plain binary COPY (target >= {STAGING_TARGETS['binary']}x)",
            f"staging / Spark JDBC (target >= {STAGING_TARGETS['jdbc']}x)",
            "staging / 2PC",
            "the driver's move s (min/median/max)",
            "PG CPU µs/row staging",
            "PG CPU µs/row 2PC",
        ],
        rows,
        "rrrrrrr",
    )


def profile_table(res: Results) -> str:
    rows = []
    for p, pr in sorted(res.profiles.items()):
        rows.append(
            [
                str(p),
                f"{pr['tasks']:.0f}",
                f"{pr['span']:.2f}",
                f"{pr['feed']:.2f} ({pr['feed'] / pr['span']:.0%})",
                f"{pr['write']:.2f} ({pr['write'] / pr['span']:.0%})",
                f"{pr['begin']:.3f}",
                f"{pr['prepare']:.3f} (max {pr['prepare_max'] * 1000:.0f} ms)",
            ]
        )
    return _bench.markdown_table(
        [
            "partitions",
            "tasks",
            "task s (sum)",
            "waiting for batches s",
            "cast + encode + COPY s",
            "begin s",
            "prepare s",
        ],
        rows,
        "rrrrrrr",
    )


def wide_rows_per_s(res: Results, writer: str) -> float:
    secs = [m.seconds for m in res.wide if m.writer == writer]
    return res.wide_rows / _bench.median(secs) if secs else float("nan")


def bytes_per_row(runs: Sequence[_bench.Measurement]) -> float:
    return _bench.median([m.extra.get("table_bytes", 0) / m.rows for m in runs])


def wide_table(res: Results) -> str:
    rows = []
    base = wide_rows_per_s(res, "binary")
    for writer in WIDE_WRITERS:
        runs = [m for m in res.wide if m.writer == writer]
        if not runs:
            continue
        rate = wide_rows_per_s(res, writer)
        rows.append(
            [
                LABELS[writer],
                _bench.fmt_rate(rate) + (" VOID" if any(m.extra.get("void") for m in runs) else ""),
                _bench.fmt_secs([m.seconds for m in runs]),
                f"{rate / base:.2f}x",
                f"{bytes_per_row(runs):.0f}",
                f"{_bench.cpu_per_row(runs, 'postgres'):.2f}",
            ]
        )
    return _bench.markdown_table(
        [
            "writer",
            "rows/s (median)",
            "wall s per run",
            "vs plain binary COPY",
            "table bytes/row",
            "PG CPU µs/row",
        ],
        rows,
        "lrrrrr",
    )
