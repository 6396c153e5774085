"""The benchmarks' CPU meter and their fair-feed settings (``benchmarks._bench``): parsing
``/proc`` stat lines, the roles of the driver's process tree, CPU by role and thread between
two snapshots of a fake ``/proc``, the paired ratio range and the CPU table, and the feed
settings every writer of a run gets. No Spark, no server."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from benchmarks import _bench
from benchmarks._bench import cpu as cpu_mod
from benchmarks._bench import feed

from txsink.spark import jobs, versions

TICK = cpu_mod.TICK


def _line(pid: int, comm: str, ppid: int, utime: int, stime: int = 0, cutime: int = 0) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime ...
    return f"{pid} ({comm}) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} {stime} {cutime} 0 20 0 1 0"


def test_stat_lines_parse_with_spaces_and_parentheses_in_the_name() -> None:
    stat = _bench.ProcStat.parse(_line(42, "C2 CompilerThre", 7, 300, 20, 5))
    assert (stat.pid, stat.comm, stat.ppid, stat.own, stat.total) == (
        42,
        "C2 CompilerThre",
        7,
        320,
        325,
    )
    odd = _bench.ProcStat.parse(_line(9, "a) (b", 1, 1, 2))
    assert (odd.comm, odd.ppid, odd.own) == ("a) (b", 1, 3)


def _table(*lines: str) -> dict[int, _bench.ProcStat]:
    return {s.pid: s for s in map(_bench.ProcStat.parse, lines)}


def test_the_driver_tree_splits_into_driver_jvm_and_workers() -> None:
    table = _table(
        _line(100, "python", 1, 0),  # the benchmark (driver)
        _line(101, "java", 100, 0),  # Spark's JVM
        _line(102, "uptime", 100, 0),  # something the driver ran
        _line(103, "python3", 101, 0),  # pyspark.daemon
        _line(104, "python3", 103, 0),  # a worker
        _line(200, "java", 1, 0),  # another JVM (the broker): not in the tree
    )
    assert cpu_mod.driver_roles(table, 100) == {
        100: "driver",
        101: "jvm",
        102: "driver",
        103: "workers",
        104: "workers",
    }


def test_driver_side_workers_are_told_from_task_workers_by_their_module() -> None:
    table = _table(
        _line(100, "python", 1, 0),  # the benchmark (driver)
        _line(101, "java", 100, 0),  # Spark's JVM
        _line(103, "python3", 101, 0),  # pyspark.daemon pyspark.worker: tasks
        _line(104, "python3", 103, 0),
        _line(105, "python3", 101, 0),  # a Data Source's commit runner's daemon
        _line(106, "python3", 105, 0),  # ... and the worker it forked
        _line(107, "python3", 101, 0),  # started without a daemon, for planning
    )
    cmdlines = {
        103: "/venv/bin/python -m pyspark.daemon pyspark.worker ",
        105: "/venv/bin/python -m pyspark.daemon pyspark.sql.worker.python_streaming_sink_runner ",
        107: "/venv/bin/python -m pyspark.sql.worker.write_into_data_source ",
    }
    assert cpu_mod.driver_roles(table, 100, cmdlines) == {
        100: "driver",
        101: "jvm",
        103: "workers",
        104: "workers",
        105: "driver_workers",
        106: "driver_workers",
        107: "driver_workers",
    }
    assert cpu_mod.driver_roles(table, 100)[105] == "workers"  # no command lines: tasks'


class _FakeProc:
    """A ``/proc`` folder: processes, their threads and the machine's line."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(
        self,
        procs: dict[int, tuple[str, int, int, int]],
        threads: dict[int, dict[int, tuple[str, int]]],
        busy: int,
    ) -> None:
        """``procs``: pid -> (comm, ppid, own ticks, reaped children's ticks);
        ``threads``: pid -> tid -> (comm, ticks); ``busy``: the machine's busy ticks."""
        for old in self.root.glob("[0-9]*"):
            for f in sorted(old.rglob("*"), reverse=True):
                f.unlink() if f.is_file() else f.rmdir()
            old.rmdir()
        (self.root / "stat").write_text(f"cpu  {busy} 0 0 1000 0 0 0 0 0 0\n")
        for pid, (comm, ppid, own, reaped) in procs.items():
            folder = self.root / str(pid)
            folder.mkdir()
            (folder / "stat").write_text(_line(pid, comm, ppid, own, 0, reaped))
            for tid, (tcomm, ticks) in threads.get(pid, {}).items():
                task = folder / "task" / str(tid)
                task.mkdir(parents=True)
                (task / "stat").write_text(_line(tid, tcomm, ppid, ticks))


def test_cpu_by_role_and_thread_between_two_snapshots(tmp_path: Path) -> None:
    proc = _FakeProc(tmp_path)
    meter = _bench.CpuMeter({"spark": 100, "kafka": 300}, proc=tmp_path)
    t = TICK  # one second
    proc.write(
        {
            100: ("python", 1, 1 * t, 0),
            101: ("java", 100, 10 * t, 0),
            103: ("python3", 101, 0, 0),
            104: ("python3", 103, 4 * t, 0),  # a worker that exits before the second snapshot
            105: ("python3", 103, 2 * t, 0),
            300: ("java", 1, 5 * t, 0),
        },
        {
            101: {101: ("java", 1 * t), 110: ("C2 CompilerThre", 3 * t), 111: ("GC Thread#0", t)},
            104: {104: ("python3", 3 * t)},
            105: {105: ("python3", 1 * t), 106: ("rdk:main", 1 * t)},
        },
        busy=100 * t,
    )
    before = meter.snapshot()
    proc.write(
        {
            100: ("python", 1, 2 * t, 0),
            101: ("java", 100, 20 * t, 0),
            103: ("python3", 101, 0, 5 * t),  # reaped 104: 4 s before + 1 s since
            105: ("python3", 103, 6 * t, 0),
            107: ("python3", 103, 1 * t, 0),  # a new worker
            300: ("java", 1, 7 * t, 0),
        },
        {
            101: {101: ("java", 1 * t), 110: ("C2 CompilerThre", 5 * t), 111: ("GC Thread#0", t)},
            105: {105: ("python3", 4 * t)},  # its librdkafka thread ended: in the process only
            107: {107: ("python3", 1 * t)},
        },
        busy=130 * t,
    )
    got = _bench.CpuMeter.delta(before, meter.snapshot())
    assert got == pytest.approx(
        {
            "driver": 1.0,
            "jvm": 10.0,
            "jvm_jit": 2.0,
            "jvm_gc": 0.0,
            "workers": 6.0,  # 105: +4, 107: +1, 104's last second via 103's cutime
            "workers_main": 4.0,  # 105: 1 -> 4, 107: new, 1
            "workers_threads": 1.0,  # 105's own +4 and 107's 1, less the main threads' 4
            "workers_exited": 1.0,
            "driver_workers": 0.0,  # no worker runs a driver-side module here
            "spark": 17.0,
            "kafka": 2.0,
            "others": 11.0,  # the machine's 30 less the 19 measured
        }
    )


def test_the_meter_reads_the_command_lines_of_the_jvms_children(tmp_path: Path) -> None:
    proc = _FakeProc(tmp_path)
    meter = _bench.CpuMeter({"spark": 100}, proc=tmp_path)
    t = TICK
    procs = {
        100: ("python", 1, 0, 0),
        101: ("java", 100, 0, 0),
        103: ("python3", 101, 0, 0),
        105: ("python3", 101, 0, 0),
    }
    proc.write(procs, {}, busy=10 * t)
    before = meter.snapshot()
    proc.write({**procs, 103: ("python3", 101, 2 * t, 0), 105: ("python3", 101, 3 * t, 0)},
               {}, busy=20 * t)  # fmt: skip
    (tmp_path / "105" / "cmdline").write_bytes(
        b"python\0-m\0pyspark.daemon\0pyspark.sql.worker.commit_data_source_write\0"
    )
    got = _bench.CpuMeter.delta(before, meter.snapshot())
    assert (got["workers"], got["driver_workers"], got["spark"]) == (2.0, 3.0, 5.0)
    assert got["others"] == 5.0  # the machine's 10 less the 5 measured: not counted twice


def test_no_proc_no_figures(tmp_path: Path) -> None:
    meter = _bench.CpuMeter({"spark": 1}, proc=tmp_path / "none")
    assert meter.snapshot() == {}
    assert _bench.CpuMeter.delta({}, {}) == {}


def _run(writer: str, seconds: float, cpu: dict[str, float]) -> _bench.Measurement:
    return _bench.Measurement(writer, 2, 1_000_000, seconds, 0.5, 0.5, {"cpu": cpu})


class _Res(_bench.Results):
    name, title, server, baseline = "t", "T", "kafka", "spark"


def test_the_cpu_table_pairs_runs_and_shows_cpu_per_million_by_role() -> None:
    res = _Res(1_000_000, [2], 3)
    cpu = {"spark": 3.0, "jvm": 2.5, "workers": 0.4, "driver": 0.1, "kafka": 0.6, "others": 9.0}
    for base, mine in ((1.0, 2.0), (1.2, 1.0), (1.0, 1.25)):
        res.runs += [_run("spark", base, cpu), _run("direct", mine, {**cpu, "spark": 4.0})]
    assert res.ratio_range("direct", 2) == pytest.approx((0.5, 0.8, 1.2))
    assert _bench.ratio_range_cell(res, "direct", 2) == "0.80x (0.50-1.20)"
    table = _bench.cpu_table(
        res, {"direct": "direct"}, ["direct", "spark"], servers=[("kafka", "broker")]
    )
    lines = table.splitlines()
    assert "CPU-s per 1M: total" in lines[0] and "broker" in lines[0]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    # partitions, writer, rate, ratio, total (Spark 4.0 + broker 0.6), JVM 2.5, JIT (not
    # measured), workers 0.4, main, threads (not measured), driver 0.1, broker 0.6, others 9.0
    assert cells == ["2", "direct", "800,000", "0.80x (0.50-1.20)", "4.60", "2.50", "-",
                     "0.40", "-", "-", "0.10", "0.60", "9.00"]  # fmt: skip
    assert [c.strip() for c in lines[3].strip("|").split("|")][3] == ""  # the baseline


def test_each_feed_is_one_session_setting_for_every_writer() -> None:
    assert feed.NO_BYTE_CAP == jobs._NO_BYTE_CAP  # the value txsink sets for its own jobs
    cap = versions.arrow_byte_cap_setting()
    assert feed.feed_conf("same") == ({cap: jobs._NO_BYTE_CAP} if cap else {})
    assert feed.feed_conf("defaults") == {}
    with pytest.raises(ValueError, match="unknown feed"):
        feed.feed_conf("fast")
    parser = argparse.ArgumentParser()
    feed.add_feed_option(parser)
    assert parser.parse_args([]).feed == "same"
    assert parser.parse_args(["--feed", "defaults"]).feed == "defaults"
    res = _Res(10, [2], 1)
    assert (res.section, res.section_after) == ("t", None)
    res.feed = "defaults"
    assert (res.section, res.section_after) == ("t-spark-defaults", "t")
    assert "Spark defaults" in _bench.feed_note("defaults")
    res.runs = [_run("direct", 1.0, {"spark": 1.0})]
    text = "\n".join(_bench.cpu_blocks(res, {"direct": "txsink direct"}, ["direct"]))
    assert "| txsink direct † |" in text and "† txsink lifts" in text
    res.feed = "same"
    assert "†" not in "\n".join(_bench.cpu_blocks(res, {"direct": "txsink direct"}, ["direct"]))
