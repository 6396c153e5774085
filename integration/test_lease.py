"""Issue 34, points 2 and 3, on the real servers: a decided epoch the broker refuses for
good is *blocked* (shown, fixed, finished by ``txsink recover`` exactly once), and
the driver lease: two live drivers restarted together (one refused before it touches
anything, the other undisturbed), and a driver frozen past its lease (taken over, fenced).

Read back with a confluent-kafka ``read_committed`` consumer (integration/readback.py),
not with txsink.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from readback import open_transactions, read_topic

from tests.memsink import memory_precommit
from txsink import Coordinator
from txsink.errors import InjectedFault
from txsink.protocol.faults import FaultPlan
from txsink.protocol.lease import current_lease, live_holder
from txsink.protocol.log import open_log
from txsink.runner import FAILED_LINE
from txsink.testing.hooks import PointHooks
from txsink.testing.inputs import append_input, make_input
from txsink.testing.targets import RunTarget, child_env, new_targets
from txsink.testing.verifiers import count_ids, verify

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
APP = "lease-app"


def _set_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _pipeline(tmp_path: Path, bootstrap: str, topic: str, uid: str) -> str:
    """A pipeline file as an operator's ``txsink recover --pipeline`` loads it."""
    path = tmp_path / "pipeline.py"
    path.write_text(
        textwrap.dedent(
            f"""
            from txsink import Coordinator
            from txsink.connectors.kafka import KafkaSink

            def build():
                sink = KafkaSink({bootstrap!r}, {topic!r}, uid={uid!r}, key="key",
                                 wal={str(tmp_path / "wal")!r}, shards=2)
                return Coordinator([sink], log={str(tmp_path / "log")!r}, app_id={APP!r})
            """
        )
    )
    return f"{path}:build"


def _txsink(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txsink.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _batches(ids: range, big: int | None) -> list[list[pa.RecordBatch]]:
    """Two partitions of rows ``{"id", "key", "pad"}``; row ``big`` carries 60 KB that no
    compression makes smaller than 20 KB."""
    half = len(ids) // 2
    noise = base64.b64encode(os.urandom(45_000)).decode()
    out = []
    for part in (ids[:half], ids[half:]):
        pad = [noise if i == big else "" for i in part]
        out.append(
            [
                pa.RecordBatch.from_pydict(
                    {"id": list(part), "key": [f"k{i}" for i in part], "pad": pad}
                )
            ]
        )
    return out


def _ids(bootstrap: str, topic: str) -> list[int]:
    return sorted(json.loads(r.value or b"null")["id"] for r in read_topic(bootstrap, topic))


def test_a_topic_limit_lowered_after_the_decision_blocks_the_epoch_until_fixed(
    kafka: Any, tmp_path: Path
) -> None:
    from txsink.connectors.kafka import KafkaSink

    topic = kafka.new_topic(2)
    uid = "blk" + uuid.uuid4().hex[:8]
    pipeline = _pipeline(tmp_path, kafka.bootstrap, topic, uid)
    sink = KafkaSink(
        kafka.bootstrap, topic, uid=uid, key="key", wal=str(tmp_path / "wal"), shards=2
    )
    faults = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    coord = Coordinator([sink], log=str(tmp_path / "log"), app_id=APP, faults=faults)
    # The start-up check a query's first batch runs (it creates the marker topic): the
    # test must not lean on another test having made it.
    sink.check(_batches(range(0, 1), None)[0][0].schema, APP)
    coord.run_epoch(0, memory_precommit(_batches(range(0, 100), None)), app_id=APP)
    with pytest.raises(InjectedFault):  # epoch 1 decided, not committed
        coord.run_epoch(1, memory_precommit(_batches(range(100, 200), 150)), app_id=APP)
    coord.close()

    # The operator lowers the topic's limit between the decision and the commit.
    _set_topic_config(kafka.bootstrap, topic, "max.message.bytes", "20000")
    done = _txsink("recover", "--log", str(tmp_path / "log"), "--pipeline", pipeline)
    assert done.returncode == 1, done.stdout + done.stderr
    err = " ".join(done.stderr.split())
    assert "epoch 1 is BLOCKED" in err, err
    assert "max.message.bytes" in err and "kafka-configs" in err and f"--entity-name {topic}" in err
    assert "key b'k150'" in err, err
    assert "recovery retries" not in err

    status = _txsink("status", "--log", str(tmp_path / "log"), "--json")
    assert status.returncode == 0, status.stderr
    epochs = {e["epoch"]: e for e in json.loads(status.stdout)["epochs"]}
    assert epochs[1]["status"] == "blocked"
    assert epochs[1]["blocked"]["sink_uid"] == uid
    assert "max.message.bytes" in epochs[1]["blocked"]["fix"]
    table = _txsink("status", "--log", str(tmp_path / "log"))
    assert "BLOCKED since" in table.stdout, table.stdout

    # Fixed: recover commits the epoch, exactly once, nothing left open.
    _set_topic_config(kafka.bootstrap, topic, "max.message.bytes", "1048588")
    done = _txsink("recover", "--log", str(tmp_path / "log"), "--pipeline", pipeline)
    assert done.returncode == 0, done.stdout + done.stderr
    assert open_log(tmp_path / "log").state(1).status == "committed"
    assert count_ids(range(200), _ids(kafka.bootstrap, topic)).ok
    assert open_transactions(kafka.bootstrap, topic) == 0
    assert not os.listdir(tmp_path / "wal") or all(
        not files for _, _, files in os.walk(tmp_path / "wal")
    )


# -- two live drivers (the driver lease) ---------------------------------------------------
#
# Each driver is a real process (``python -m txsink.runner
# txsink.testing.pipelines:run_stream``), one query run, no restart, files + Postgres +
# Kafka (WAL mode) + S3 behind one Coordinator. Each target is read back by its testing
# adapter's verifier (psycopg, a read_committed consumer, boto3, the files themselves),
# which also counts what lingers (prepared transactions, open Kafka transactions and WAL
# segments, open multipart uploads, staged files).

CONNECTORS = ("files", "postgres", "kafka", "s3")


class Driver:
    """One driver process of the pipeline; its merged output collected by a thread."""

    def __init__(self, args: dict[str, Any], env: dict[str, str]) -> None:
        cmd = [sys.executable, "-m", "txsink.runner", "txsink.testing.pipelines:run_stream"]
        self.proc = subprocess.Popen(
            [*cmd, json.dumps(args)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout or ():
            self.lines.append(line.rstrip("\n"))

    def wait(self, timeout: float = 600) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.end()
            raise
        self._reader.join(30)
        return code

    def end(self) -> None:
        """However the test went: never leave a driver running (or stopped)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def failure(self) -> str:
        return next((ln for ln in reversed(self.lines) if ln.startswith(FAILED_LINE)), "")

    def committed(self) -> list[int]:
        return [int(m) for ln in self.lines for m in re.findall(r" epoch (\d+)\] committed", ln)]


@pytest.fixture
def drivers() -> Iterator[list[Driver]]:
    started: list[Driver] = []
    yield started
    for driver in started:
        driver.end()


def _targets(tmp_path: Path, rows: int, files: int) -> tuple[list[RunTarget], dict[str, Any]]:
    """Fresh targets, the input's first ``files`` files, and the pipeline's arguments."""
    make_input(tmp_path / "input", rows, files)
    made = new_targets(list(CONNECTORS), tmp_path, tag="lease")
    args = {
        "workdir": str(tmp_path),
        "sinks": [t.spec for t in made],
        "log": str(tmp_path / "txlog"),
    }
    return made, args


def _exactly_once(made: list[RunTarget], rows: int, log: str) -> None:
    for target in made:
        verdict = verify(target.verifier(range(rows), log=log))
        assert verdict.duplicates == 0 and verdict.missing == 0, (target.connector, verdict)
        assert verdict.unexpected == 0 and verdict.lingering == 0, (target.connector, verdict)


@pytest.fixture
def cleanup() -> Iterator[list[RunTarget]]:
    made: list[RunTarget] = []
    yield made
    for target in made:
        with contextlib.suppress(Exception):
            target.adapter.drop_target(target.spec, target.env)


@pytest.mark.chaos
@pytest.mark.postgres
@pytest.mark.s3
def test_two_drivers_restarted_together_one_is_refused_before_touching_anything(
    kafka: Any,
    postgres: Any,
    s3: Any,
    tmp_path: Path,
    drivers: list[Driver],
    cleanup: list[RunTarget],
) -> None:
    """A query that ran before (its checkpoint exists) is started twice at once, as a
    supervisor restarting it while an operator does the same.

    Without a lease held before ``start()``, both Spark queries read the checkpoint and
    race to write ``offsets/<n>``: Spark fails one with ``CONCURRENT_STREAM_LOG_UPDATE``,
    and the other one later, in the middle of its run (seen: both ended). With it, the
    second is refused by ``DriverLeaseError`` before its Spark session exists."""
    made, args = _targets(tmp_path, 100, 1)
    cleanup += made
    env = {**os.environ, **child_env(made)}
    first_run = Driver(args, env)
    assert first_run.wait() == 0, first_run.output
    append_input(tmp_path / "input", 100, 400, 1, 4)  # four more epochs to write

    pair = [Driver(args, env), Driver(args, env)]
    drivers += pair
    codes = [d.wait() for d in pair]
    assert sorted(codes) == [0, 1], [d.output[-3000:] for d in pair]
    winner, refused = (pair[0], pair[1]) if codes[0] == 0 else (pair[1], pair[0])

    # The second: refused by the lease, before its Spark query existed, having done nothing.
    said = refused.failure()
    assert "DriverLeaseError" in said and "is running this query" in said, refused.output[-3000:]
    assert "Nothing was voided or aborted" in said, said
    assert refused.committed() == [], refused.output[-3000:]
    assert "CONCURRENT_STREAM_LOG_UPDATE" not in refused.output
    assert "Concurrent update to the log" not in refused.output
    # The first: undisturbed, every epoch in its one run, nothing of its own aborted.
    assert winner.committed() == [1, 2, 3, 4], winner.output[-3000:]
    assert not winner.failure() and "aborted" not in winner.output, winner.output[-3000:]
    # No void, one round per epoch, everything committed.
    states = open_log(tmp_path / "txlog").states()
    assert [(s.epoch, s.rounds, s.voided, s.status) for s in states] == [
        (e, (0,), (), "committed") for e in range(5)
    ]
    _exactly_once(made, 500, args["log"])


@pytest.mark.chaos
@pytest.mark.postgres
@pytest.mark.s3
def test_a_driver_frozen_past_its_lease_is_taken_over_and_fenced(
    kafka: Any,
    postgres: Any,
    s3: Any,
    tmp_path: Path,
    drivers: list[Driver],
    cleanup: list[RunTarget],
) -> None:
    """The first driver's Python process is frozen (SIGSTOP) at epoch 1, every task's
    transaction prepared and not yet decided, for longer than its lease (``lease_s=5``).
    A second driver takes the lease over, voids and aborts the frozen one's round, and
    runs the query to its end. Resumed (SIGCONT), the first is fenced: ``FencedError``,
    nothing decided by it. Every target holds every row once, nothing lingers."""
    made, args = _targets(tmp_path, 300, 3)
    cleanup += made
    env = {**os.environ, **child_env(made)}
    hooks = PointHooks(tmp_path / "hooks")
    first_holder: list[Driver] = []

    def freeze() -> None:
        os.kill(first_holder[0].proc.pid, signal.SIGSTOP)

    hooks.at("before_decision", freeze, epoch=1)
    log = open_log(tmp_path / "txlog")
    with hooks:
        first = Driver({**args, "lease_s": 5, "hooks": hooks.spec()}, env)
        first_holder.append(first)
        drivers.append(first)
        while not hooks.fired:  # frozen at epoch 1's decision
            assert first.proc.poll() is None, first.output[-3000:]
            time.sleep(0.2)
    held = current_lease(log)
    assert held is not None and held.pid == first.proc.pid and held.lease_s == 5
    while live_holder(log) is not None:  # its lease expires (it renews no more)
        time.sleep(0.5)

    second = Driver({**args, "lease_s": 5}, env)
    drivers.append(second)
    assert second.wait() == 0, second.output[-3000:]
    assert "took over the driver lease" in second.output, second.output[-3000:]
    assert second.committed() == [1, 2], second.output[-3000:]

    os.kill(first.proc.pid, signal.SIGCONT)
    assert first.wait() == 1, first.output[-3000:]
    said = first.failure()
    assert "FencedError" in said, first.output[-3000:]
    assert first.committed() == [0], first.output[-3000:]

    state = log.state(1)
    assert state.status == "committed" and state.voided == (0,) and state.rounds == (0, 1)
    _exactly_once(made, 300, args["log"])
