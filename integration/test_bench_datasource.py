"""The Data Source and live-metrics benchmarks' pure parts (``benchmarks.datasource``,
``benchmarks.metrics``): a query's measured window and start-up from the epoch listener's
snapshots, the paired ratio cells, their reports and the sections they write. No Spark, no
server."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks import _bench, datasource, metrics
from benchmarks._bench import epochs as metered
from benchmarks._datasource_report import Results, render

MACHINE = {"cpu": "cpu", "cores": "2", "memory": "1 GiB", "os": "os", "python": "3", "java": "17"}


def _meter(cpu_at: dict[int, dict[str, float]], rows: int = 100) -> metered.Meter:
    meter = metered.Meter("q")
    for batch, snap in cpu_at.items():
        meter.epochs[batch] = metered.Epoch(batch, rows, 0.1 * (batch + 1), 10.0 + batch, snap)
    return meter


def _snap(machine: float, driver: float, workers: float) -> dict[str, float]:
    return {"machine": machine, "driver": driver, "jvm": 0.0, "workers": 0.0,
            "driver_workers": workers}  # fmt: skip


def test_the_window_follows_the_first_epoch_and_the_start_up_ends_with_it() -> None:
    meter = _meter({0: _snap(5, 1, 1), 1: _snap(6, 1.5, 1.2), 2: _snap(8, 2, 1.6)})
    m = datasource.measurement("datasource", 2, 100, 3, meter, (7.5, _snap(1, 0.5, 0), 0.3))
    assert (m.rows, m.seconds) == (200, 2.0)  # epochs 1 and 2; from 10.0 to 12.0
    assert m.extra["start_s"] == 2.5  # start() at 7.5, epoch 0's event at 10.0
    assert m.extra["start_cpu"]["driver_workers"] == 1.0  # the start-up's, left out below
    assert m.extra["cpu"]["driver_workers"] == pytest.approx(0.6)
    assert m.extra["cpu"]["driver"] == 1.0
    assert m.extra["epochs_s"] == pytest.approx([0.2, 0.3])
    missing = datasource.measurement("foreachBatch", 2, 100, 4, meter, (0.0, {}, 0.3))
    assert missing.rows == 0 and missing.extra == {"cpu": {}}


def test_paired_cells_pair_run_by_run() -> None:
    assert _bench.paired_cell([2.0, 3.0, 1.0], [1.0, 2.0, 1.0]) == "1.50x (1.00-2.00)"
    assert _bench.paired_cell([2.0], [1.0, 5.0]) == "2.00x"
    assert _bench.paired_cell([1.0], [0.0]) == "-"
    assert _bench.min_median_max([0.3, 0.1, 0.2], scale=1000, digits=0) == "200 (100-300)"
    assert _bench.min_median_max([]) == "-"


def _ds_run(writer: str, start: float, epoch: float, cpu: dict[str, float]) -> _bench.Measurement:
    start_cpu = {"driver": 0.5, "driver_workers": 0.25, "jvm": 1.0, "workers": 0.25}
    extra = {"cpu": cpu, "start_s": start, "epochs_s": [epoch, epoch * 3, epoch],
             "start_cpu": start_cpu}  # fmt: skip
    return _bench.Measurement(writer, 2, 200 * 3, epoch * 3, 0.5, 0.5, extra)


def _ds_results(connector: str = "files") -> Results:
    res = Results(600, [2], 2, machine=MACHINE, epochs=4, connector=connector, epoch_rows=200)
    fb = {"driver": 0.3, "jvm": 1.5, "workers": 0.3, "driver_workers": 0.0, "spark": 2.1}
    ds = {"driver": 0.0, "jvm": 1.2, "workers": 0.3, "driver_workers": 0.3, "spark": 1.8}
    res.runs = [
        _ds_run("foreachBatch", 2.0, 0.3, fb),
        _ds_run("datasource", 3.0, 0.3, ds),
        _ds_run("datasource", 2.0, 0.2, ds),
        _ds_run("foreachBatch", 2.0, 0.4, fb),
    ]
    return res


def test_the_datasource_report_pairs_repeats_and_shows_driver_side_workers() -> None:
    text = render(_ds_results())
    timing = text.split("### Start-up and per-epoch time")[1].split("###")[0]
    ds_row = next(line for line in timing.splitlines() if "format(" in line)
    cells = [c.strip() for c in ds_row.strip("|").split("|")]
    # start-ups 3.0 / 2.0 and 2.0 / 2.0; medians per epoch 0.3 / 0.3 and 0.2 / 0.4
    assert cells[2:6] == ["2.50 (2.00-3.00)", "250 (200-300)", "1.25x (1.00-1.50)",
                          "0.75x (0.50-1.00)"]  # fmt: skip
    assert cells[6] == "2.00: 0.50 / 0.25 / 1.00 / 0.25"
    cpu = text.split("### CPU per epoch by role")[1]
    assert "driver-side Python workers" in cpu and "CPU-s per epoch: total" in cpu
    per_epoch = next(line for line in cpu.splitlines() if "format(" in line)
    # the window held 600 rows: 1.8 CPU-s of Spark is 0.6 per 200-row epoch; 0.1 driver-side
    cells = [c.strip() for c in per_epoch.strip("|").split("|")]
    assert (cells[4], cells[-3], cells[-2]) == ("0.60", "0.00", "0.10")  # total, driver, -side
    assert "on the driver side (the driver's process and the driver-side Python workers) " in (text)
    assert "0.100 s against 0.100 s" in text


def test_each_connector_and_feed_has_its_own_section(tmp_path: Path) -> None:
    files, pg = _ds_results(), _ds_results("postgres")
    assert (files.section, files.section_after) == ("datasource", None)
    assert (pg.section, pg.section_after) == ("datasource-postgres", "datasource")
    pg.feed = "defaults"
    assert (pg.section, pg.section_after) == (
        "datasource-postgres-spark-defaults",
        "datasource-postgres",
    )
    doc = tmp_path / "b.md"
    doc.write_text("# B\n\n<!-- bench:datasource:start -->\nold\n<!-- bench:datasource:end -->\n")
    _bench.update_doc_section(files.section, render(files), doc, files.section_after)
    _bench.update_doc_section(pg.section, render(pg), doc, pg.section_after)
    text = doc.read_text()
    assert "old" not in text
    assert text.index("## The Data Source path next to foreachBatch (start-up") < text.index(
        "## The Data Source path next to foreachBatch (start-up and per-epoch cost), "
        "PostgreSQL, with Spark's defaults"
    )


def test_the_datasource_options() -> None:
    args = datasource.parser().parse(["--epochs", "3", "--connector", "postgres"])
    assert (args.epochs, args.rows, args.partitions) == (3, 200, [2])
    assert args.connector == "postgres"
    assert args.writers == ["foreachBatch", "datasource"]


def _m_run(writer: str, epochs: list[float], driver: float) -> _bench.Measurement:
    extra = {"cpu": {"driver": driver, "spark": driver + 1.0, "jvm": 1.0}, "epochs_s": epochs,
             "read_s": [0.001] * len(epochs), "read_cpu": [0.002] * len(epochs)}  # fmt: skip
    return _bench.Measurement(writer, 2, 2000 * len(epochs), sum(epochs), 0.5, 0.5, extra)


def test_the_metrics_report_pairs_rounds_and_shows_the_drivers_cpu() -> None:
    res = metrics.Results(8000, [2], 1, machine=MACHINE, epochs=4, epoch_rows=2000)
    res.runs = [
        _m_run("none", [0.10, 0.12, 0.10, 0.20], 0.04),
        _m_run("prometheus", [0.11, 0.12, 0.09, 0.22], 0.06),
        _m_run("otel", [0.10, 0.12, 0.10, 0.20], 0.04),
    ]
    text = metrics.render(res)
    table = text.split("### Time and the driver's CPU per epoch")[1].split("###")[0]
    prom = next(line for line in table.splitlines() if "| prometheus" in line)
    cells = [c.strip() for c in prom.strip("|").split("|")]
    # rounds: 1.1, 1.0, 0.9, 1.1 -> median 1.05; medians 115 vs 110 ms; driver 15 vs 10 ms
    assert cells[2:] == ["115.0 (90.0-220.0)", "1.050x (0.900-1.100)", "+5.0", "15.0", "+5.0",
                         "1.0 / 2.0"]  # fmt: skip
    assert "faster in some rounds and slower in others: within the noise" in text
    assert "the driver's CPU per epoch +5.0 ms against none" in text
    assert "CPU-s per epoch: total" in text.split("### CPU per epoch by role")[1]


def test_the_metrics_benchmark_needs_no_server(capsys: pytest.CaptureFixture[str]) -> None:
    args = metrics.parser().parse(["--epochs", "3"])
    assert (args.epochs, args.rows, args.writers) == (3, 2000, ["none", "prometheus", "otel"])
    with pytest.raises(SystemExit):
        metrics.parser().parse(["--help"])
    assert "--dsn" not in capsys.readouterr().out
