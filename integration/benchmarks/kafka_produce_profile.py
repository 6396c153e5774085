"""CPU per record of KafkaSink's produce path, by role and thread: the before/after profile
of issue 37 point 4 (docs/performance.md, "The Kafka produce path").

One local[2] session; a cached frame of ``--rows`` records (a ~20-byte string key and a
~210-byte JSON value) in ``--partitions`` partitions; per mode (direct, wal, replay) one
warm-up epoch, then ``--repeats`` epochs, each into a fresh topic through the whole
protocol (``Coordinator.write``), read back with a ``read_committed`` consumer (count and
distinct values must equal the input). Around each epoch, ``/proc/<pid>/stat`` and
``/proc/<pid>/task/<tid>/stat`` give the CPU seconds of:

    driver      this Python process (all its threads)
    jvm         the Spark JVM (its own threads; not its children)
    py_main     Spark's Python workers: the main threads (Arrow, encoding, checksum, the
                produce calls)
    py_rdkafka  the same processes' librdkafka threads (named ``rdk:*``), living or ended
                (a process's CPU minus its living threads' other than ``rdk:*``)
    py_other    the same processes' other living threads (e.g. OpenBLAS's)
    py_exited   workers that exited during the epoch (their parent's reaped children)
    broker      the Kafka broker of ``integration/services`` (its pid file)

Prints a JSON line per epoch and a table of medians in CPU-seconds per 1M records. Run::

    integration/services up kafka
    set -a; . integration/.services.env; set +a
    python integration/benchmarks/kafka_produce_profile.py --rows 300000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROLES = ("driver", "jvm", "py_main", "py_rdkafka", "py_other", "py_exited", "broker")
_TICK = os.sysconf("SC_CLK_TCK")
KEY_EXPR = "concat('user-', lpad(cast((id * 7919) % 250000 AS string), 7, '0'))"
VALUE_EXPR = (
    "to_json(named_struct('id', id, 'type', element_at(array('page_view', 'click', "
    "'purchase'), cast(id % 3 + 1 AS int)), 'user', "
    + KEY_EXPR
    + ", 'session', substr(sha2(cast(id DIV 20 AS string), 256), 1, 16), 'ts', "
    "date_format(timestamp_micros(1704067200000000 + id * 31536000), "
    "\"yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'\"), 'page', concat('/products/', "
    "lpad(cast((id * 31) % 50000 AS string), 6, '0')), 'device', 'web', 'country', 'DE', "
    "'amount', cast(((id * 7907) % 100000) / 100.0 AS decimal(10,2)), 'currency', 'EUR'))"
)


def _stat(path: str) -> list[str]:
    raw = Path(path).read_text()
    return raw[raw.rfind(")") + 2 :].split()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out


def _cpu(fields: list[str], children: bool = False) -> float:
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks = int(fields[13]) + int(fields[14])
    return ticks / _TICK


class Roles:
    """The processes of each role, found once the session runs."""

    def __init__(self, broker_pid: int) -> None:
        self.driver = os.getpid()
        self.broker = broker_pid
        javas = [p for p in _children(self.driver) if b"java" in _cmdline(p)]
        if len(javas) != 1:
            raise RuntimeError(f"expected one Spark JVM under this process, found {javas}")
        self.jvm = javas[0]

    def snapshot(self) -> dict[str, float]:
        snap = dict.fromkeys(ROLES, 0.0)
        snap["driver"] = _cpu(_stat(f"/proc/{self.driver}/stat"))
        snap["jvm"] = _cpu(_stat(f"/proc/{self.jvm}/stat"))
        snap["broker"] = _cpu(_stat(f"/proc/{self.broker}/stat"))
        todo = [p for p in _children(self.jvm) if b"python" in _cmdline(p)]
        while todo:  # pyspark.daemon and the workers it forks
            pid = todo.pop()
            try:
                whole = _stat(f"/proc/{pid}/stat")
                main = _stat(f"/proc/{pid}/task/{pid}/stat")
                kids = _children(pid)
            except OSError:
                continue
            other = 0.0
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    name = Path(f"/proc/{pid}/task/{tid}/comm").read_text()
                    if int(tid) != pid and not name.startswith("rdk:"):
                        other += _cpu(_stat(f"/proc/{pid}/task/{tid}/stat"))
                except OSError:
                    continue
            snap["py_main"] += _cpu(main)
            snap["py_other"] += other
            snap["py_rdkafka"] += _cpu(whole) - _cpu(main) - other
            snap["py_exited"] += _cpu(whole, children=True)
            todo += kids
        return snap


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    """A fresh topic, waited for until every partition is served (ListOffsets answers): an
    idempotent producer that starts before may get its batches out of sequence."""
    from txsink.connectors.kafka.clients.offsets import topic_ends
    from txsink.connectors.kafka.readback import admin_client, create_topic

    create_topic(bootstrap, topic, partitions, timeout_s=60)
    admin, deadline = admin_client(bootstrap), time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if len(topic_ends(admin, topic, "read_uncommitted", 10)) == partitions:
                return
        except Exception:  # not served yet
            pass
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} is not served after 60 s")


def _read_back(bootstrap: str, topic: str, rows: int) -> tuple[int, int]:
    """(records, distinct values) a read_committed consumer sees in ``topic``."""
    from txsink.connectors.kafka.readback import read_committed_values

    values = read_committed_values(bootstrap, topic, timeout_s=120)
    return len(values), len(set(values))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="direct,wal,replay")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", default="", help="append the JSON lines to this file")
    parser.add_argument(
        "--producer-config", default="{}", help="the sink's producer_config, as JSON"
    )
    args = parser.parse_args(argv)
    bootstrap = os.environ["TXSINK_KAFKA_BOOTSTRAP"]
    here = Path(__file__).resolve().parent.parent
    broker_pid = int((here / ".work" / "pids" / "kafka.pid").read_text())

    from txsink import Coordinator
    from txsink.connectors.kafka import KafkaSink
    from txsink.connectors.kafka.readback import delete_topic
    from txsink.spark.localspark import local_spark

    spark = local_spark(fast_start=False)
    df = (
        spark.range(0, args.rows, 1, args.partitions)
        .selectExpr(f"{KEY_EXPR} AS key", f"{VALUE_EXPR} AS value")
        .cache()
    )
    df.count()
    roles = Roles(broker_pid)
    run = uuid.uuid4().hex[:8]
    marker_topic = f"txsink-profile-markers-{run}"
    results: dict[str, list[dict[str, float]]] = {}
    for mode in args.modes.split(","):
        for rep in range(args.repeats + 1):  # the first: warm-up, not counted
            topic = f"txsink-profile-{mode}-{run}-{rep}"
            _create(bootstrap, topic, args.partitions)
            with tempfile.TemporaryDirectory(prefix=f"profile-{mode}-") as tmp:
                options: dict[str, Any] = {
                    "key": "key",
                    "value": "value",
                    "marker_topic": marker_topic,
                    "mode": mode,
                    "shards": max(8, args.partitions) if mode == "direct" else args.partitions,
                    "producer_config": json.loads(args.producer_config),
                }
                if mode == "wal":
                    options["wal"] = Path(tmp, "wal")
                sink = KafkaSink(bootstrap, topic, f"profile-{mode}-{rep}", **options)
                coordinator = Coordinator([sink], log=Path(tmp, "log"), app_id=f"p-{run}")
                before, t0 = roles.snapshot(), time.perf_counter()
                result = coordinator.write(df, epoch=0)
                wall, after = time.perf_counter() - t0, roles.snapshot()
            if result.status != "committed":
                raise RuntimeError(f"{mode}: epoch not committed: {result}")
            seen, distinct = _read_back(bootstrap, topic, args.rows)
            delete_topic(bootstrap, topic)
            if (seen, distinct) != (args.rows, args.rows):
                raise RuntimeError(f"{mode}: read back {seen} records, {distinct} distinct")
            per_m = {r: (after[r] - before[r]) * 1e6 / args.rows for r in ROLES}
            per_m["total"] = sum(per_m[r] for r in ROLES)
            per_m["wall_s"] = wall
            line = {"label": args.label, "mode": mode, "rep": rep, "rows": args.rows, **per_m}
            print(
                json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in line.items()})
            )
            if args.out:
                with open(args.out, "a") as out:
                    out.write(json.dumps(line) + "\n")
            if rep:
                results.setdefault(mode, []).append(per_m)
    print(f"\nCPU-seconds per 1M records, median of {args.repeats} ({args.label or 'this tree'}):")
    cols = (*ROLES, "total", "wall_s")
    print("mode    " + " ".join(f"{c:>10}" for c in cols))
    for mode, runs in results.items():
        print(
            f"{mode:8}" + " ".join(f"{statistics.median(r[c] for r in runs):10.2f}" for c in cols)
        )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
