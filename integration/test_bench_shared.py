"""The shared measure and report helpers every benchmark uses (``benchmarks._bench``): the
order of the repeats, the output check, paired ratios, CPU per row by role and the ms
cells, in the shapes docs/benchmarks.md shows. No Spark, no server."""

from __future__ import annotations

from benchmarks import _bench


def _run(writer: str, seconds: float, cpu: dict[str, float]) -> _bench.Measurement:
    return _bench.Measurement(writer, 2, 1000, seconds, 0.5, 0.5, {"cpu": cpu})


def test_repeats_change_who_runs_first() -> None:
    writers = ["a", "b", "c"]
    assert [_bench.rotated(writers, rep)[0] for rep in range(4)] == ["a", "b", "c", "a"]
    assert _bench.rotated([], 3) == []
    assert _bench.swap_on_odd(writers, 1, "a", "c") == ["c", "b", "a"]
    assert _bench.swap_on_odd(writers, 2, "a", "c") == writers


def test_output_problems_name_the_first_thing_wrong() -> None:
    expected = (10, 10, 55)
    assert _bench.output_problems((10, 10, 55), expected, 10) == []
    assert _bench.output_problems((12, 10, 55), expected, 10) == [
        "table holds 12 rows, 10 distinct ids (want 10)"
    ]
    assert _bench.output_problems([10, 10, 54], expected, 10, "output holds") == [
        "column aggregates differ: [10, 10, 54] != (10, 10, 55)"
    ]


def test_paired_ratios_cpu_per_row_and_ms_cells() -> None:
    class Res(_bench.Results):
        name, title, server, baseline = "t", "T", "pg", "base"

    res = Res(1000, [2], 2)
    res.runs = [
        _run("txsink", 1.0, {"spark": 2.0, "pg": 0.5}),
        _run("base", 1.1, {"spark": 1.0, "pg": 1.0}),
        _run("txsink", 1.0, {"spark": 4.0, "pg": 1.5}),
        _run("base", 0.9, {"spark": 1.0, "pg": 1.0}),
    ]
    assert res.ratio_at("txsink", 2) == "1.00x at 2 partitions (single runs 0.90-1.10x)"
    assert res.straddles("txsink", 2)
    assert res.cpu_per_row("txsink", 2, "pg") == 1000.0  # median of 500 and 1500 µs
    assert _bench.cpu_per_row(res.of("base", 2), "spark") == 1000.0
    assert (_bench.ms([0.1, 0.3, 0.2]), _bench.ms([]), _bench.ms([0.1234], 1)) == (
        "200",
        "-",
        "123.4",
    )
    assert _bench.spread([0.117, 0.215, 0.15]) == "117-215"
    assert _bench.spread([0.2513, 0.386], scale=1.0, digits=3) == "0.251-0.386"
