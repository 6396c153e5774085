"""Timing one writer of the Kafka benchmark into a fresh topic, verifying what a
``read_committed`` consumer sees there, voiding the run if it is wrong; and one untimed
profile run of a txsink mode."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import _bench

from .context import Bench
from .producer import write_producer
from .records import run_feed
from .spark_sink import write_spark
from .topics import Readback, create_topic, delete_topics, read_back
from .txsink_writer import write_txsink


def measure(
    bench: Bench,
    writer: str,
    df: Any,
    *,
    rows: int,
    partitions: int,
    expected: tuple[int, ...],
    tag: str,
    profile_dir: str = "",
) -> _bench.Measurement:
    """Time one writer into a fresh topic, verify what read_committed sees, delete the topic."""
    topic = f"txsink-bench-{writer}-{tag}-{bench.run_id}".replace("_", "-")
    if writer != "feed":
        create_topic(bench.bootstrap, topic, bench.topic_partitions)
        bench.topics.append(topic)
    writers: dict[str, Callable[[], dict[str, Any]]] = {
        "direct": lambda: write_txsink(bench, "direct", df, topic, partitions, profile_dir),
        "wal": lambda: write_txsink(bench, "wal", df, topic, partitions, profile_dir),
        "replay": lambda: write_txsink(bench, "replay", df, topic, partitions, profile_dir),
        "producer": lambda: write_producer(bench.bootstrap, df, topic),
        "spark": lambda: write_spark(bench.bootstrap, df, topic),
        "feed": lambda: {"task_rows": run_feed(df)},
    }
    error = ""

    def write() -> dict[str, Any]:
        nonlocal error
        try:
            return writers[writer]()
        except Exception as err:  # a writer that fails is void; the others still run
            error = _bench.first_line(err)
            return {}

    try:
        m = _bench.timed_run(bench.cpu, writer, partitions, rows, write)
        found = read_back(bench.bootstrap, topic, rows) if writer != "feed" else None
    finally:
        if writer != "feed":
            delete_topics(bench.bootstrap, [topic])
            bench.topics.remove(topic)
    extra = m.extra
    problems = [f"failed: {error}"] if error else []
    if found is None:
        if extra.get("task_rows") != rows:
            problems.append(f"the feed job saw {extra['task_rows']} rows")
    else:
        extra["readback_s"] = found.seconds
        extra["lso_wait_s"] = found.lso_wait_s
        extra["offsets"] = found.offsets
        problems += readback_problems(found, rows, expected)
    if extra.get("wal_left", 0):
        problems.append(f"{extra['wal_left']} WAL files left behind")
    _bench.void_if(problems, m, tag, bench.void)
    tail = ""
    if found is not None:
        tail = f"  readback {found.seconds:.1f} s"
        if found.lso_wait_s:
            tail += f" (of which {found.lso_wait_s:.2f} s waiting for the commit markers)"
    _bench.log_run(m, tag, width=8, unit="rec/s", tail=tail)
    return m


def readback_problems(found: Readback, rows: int, expected: tuple[int, ...]) -> list[str]:
    """What is wrong with what read_committed sees in a topic that should hold ``rows``
    records (ids ``0..rows-1``) with the fingerprint ``expected``: [] when nothing."""
    problems = []
    if (found.records, found.distinct) != (rows, rows):
        problems.append(
            f"read_committed sees {found.records} records, {found.distinct} distinct ids "
            f"({found.duplicates} duplicates, {found.bad_ids} bad ids; want {rows})"
        )
    elif found.fingerprint() != expected:
        problems.append(f"key/value lengths or CRCs differ: {found.fingerprint()} != {expected}")
    if found.open_partitions:
        problems.append(
            f"{found.open_partitions} partitions hold an open transaction (last stable "
            f"offset below the high watermark after {found.lso_wait_s:.1f} s of waiting)"
        )
    return problems


def profile_run(bench: Bench, mode: str, df: Any, **kw: Any) -> dict[str, Any]:
    """One untimed txsink run with ProfiledKafkaSink: seconds by step, summed over tasks."""
    profile_dir = tempfile.mkdtemp(dir=bench.workdir, prefix=f"profile-{mode}-")
    m = measure(bench, mode, df, profile_dir=profile_dir, **kw)
    records = [json.loads(p.read_text()) for p in Path(profile_dir).glob("*.json")]
    pre = [r for r in records if r["kind"] == "precommit"]
    com = [r for r in records if r["kind"] == "commit"]
    check = [r for r in records if r["kind"] == "check"]

    def total(rs: list[dict[str, Any]], key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in rs)

    out: dict[str, Any] = {
        "wall": m.seconds,
        "phases": dict(m.extra.get("phases", {})),
        "void": "void" in m.extra,
        "pre_tasks": len(pre),
        "commit_units": len(com),
        "commit_where": com[0]["where"] if com else "",
        "check": total(check, "seconds"),
    }
    for key in ("begin", "write", "prepare", "span"):
        out[f"pre_{key}"] = total(pre, key)
    out["pre_feed"] = out["pre_span"] - out["pre_begin"] - out["pre_write"] - out["pre_prepare"]
    out["pre_prepare_max"] = max((float(r["prepare"]) for r in pre), default=0.0)
    for key in ("total", "producer", "marker", "transaction", "body", "records", "produce"):
        out[f"c_{key}"] = total(com, key)
    out["c_delete_wal"] = total(com, "delete_wal")
    # body = reading (WAL file, or Spark's rows + records + checksum) + the produce loop;
    # transaction - body = begin_transaction + the marker + commit_transaction (the flush).
    out["c_read"] = out["c_body"] - out["c_produce"]
    out["c_commit_txn"] = out["c_transaction"] - out["c_body"]
    out["c_other"] = (
        out["c_total"]
        - out["c_producer"]
        - out["c_marker"]
        - out["c_transaction"]
        - out["c_delete_wal"]
    )
    shutil.rmtree(profile_dir, ignore_errors=True)
    if mode == "replay":
        out["shuffle_s"] = shuffle_seconds(df, kw["partitions"])
    return out


def shuffle_seconds(df: Any, partitions: int) -> float:
    """What replay mode's resharding costs without any sink: the shuffle by the key's hash
    into ``partitions`` shards, persisted and materialised (as the coordinator does)."""
    t0 = time.perf_counter()
    data = df.repartition(partitions, "key").persist()
    try:
        rows = data.count()
        seconds = time.perf_counter() - t0
        if rows != df.count():
            raise RuntimeError("the shuffled frame lost rows")
        return seconds
    finally:
        data.unpersist(blocking=True)
