"""Speculative execution on a Spark standalone cluster: exactly once, the loser aborted.

With ``spark.speculation=true`` Spark runs a second copy of a slow task and uses whichever
attempt finishes first; the other attempt is killed, but it may have prepared its
transaction already. txsink's contract (docs/logging.md): the decision names the attempt
whose result the driver received, and after the commit every other attempt's transaction
is aborted ("an attempt the decision of epoch N did not use (a retried or speculative
task)").

How the test forces it, without a timing race:

- The cluster's two workers are distinct hosts to Spark (``127.0.0.1`` and ``127.0.0.2``):
  Spark never starts a speculative copy on a host that runs an attempt of the same task,
  and two workers on one address would never speculate.
- The first attempt of partition 0 of epoch 0 that has *prepared* pauses at the
  ``after_precommit`` crash point (a :class:`~txsink.testing.hooks.HookPlan` in the child
  driver's coordinator, served by :class:`~txsink.testing.hooks.PointHooks` here). The
  hook fires once (an exclusive create), so the speculative copy passes it. The test's
  callback holds the paused attempt until the txsink log says epoch 0 committed: the
  decision can then only name the speculative copy, and the paused attempt's prepared
  transaction is the one the driver must abort.
- Speculation is tuned to react in about a second (quantile 0.5 of two tasks, multiplier
  1.5, minTaskRuntime 200 ms, no efficiency filter, no locality wait).

Judged on the targets themselves: every id exactly once, no prepared transaction of the
run left in ``pg_prepared_xacts``, no staged file left in the files sink, the log has
every epoch committed and nothing pending; the evidence that speculation happened is the
driver's abort line naming partition 0's paused attempt of each sink, and a decision of
epoch 0 naming another attempt of partition 0.

The queries run in a child process (``python -m txsink.runner THIS_FILE:speculative_stream``)
whose SparkSession reaches this module's private cluster, started once per module.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, ClusterError, driver_conf, start_cluster

from txsink.protocol.log import open_log
from txsink.runner import run_until_done
from txsink.testing.hooks import PointHooks
from txsink.testing.inputs import make_input
from txsink.testing.targets import RunTarget
from txsink.testing.verifiers import verify
from txsink.txid import TxnId

pytestmark = [pytest.mark.cluster]

ROWS_PER_EPOCH = 200
EPOCHS = 2
#: Worker N's address: two hosts to Spark's scheduler (see the module doc).
WORKER_HOSTS = ("127.0.0.1", "127.0.0.2")
#: Speculation that reacts in about a second to one task of two still running.
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "200ms",
    # Spark 3.4+ speculates only "inefficient" tasks by default (rows per second below the
    # stage's average); a paused task that read all its rows is not one.
    "spark.speculation.efficiency.enabled": "false",
    "spark.locality.wait": "0",
}
#: How long the paused attempt is held at most: the speculative copy must have finished
#: and the epoch committed by then.
HOLD_S = 90.0
_ABORT_LINE = re.compile(
    r"aborted (?P<txn>txsink\.\S+): an attempt the decision of epoch (?P<epoch>\d+) did not use"
)


@pytest.fixture(scope="module")
def speculation_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master and two one-core workers on two loopback addresses, for this module."""
    try:
        cluster = start_cluster(
            workdir=tmp_path_factory.mktemp("speculation-cluster"), worker_hosts=WORKER_HOSTS
        )
    except (ClusterError, OSError) as err:
        pytest.fail(f"the Spark standalone cluster did not start: {err}")
    try:
        yield cluster
    finally:
        cluster.stop()


def speculative_stream(
    workdir: str, sinks: list[dict[str, Any]], master: str, app_id: str, hooks: str
) -> None:
    """The child's pipeline: the test input into ``sinks`` on ``master``, partition 0 of
    epoch 0 pausing after its pre-commit until the test's hook answers (its first
    attempt only: the hook fires once)."""
    from txsink import Coordinator
    from txsink.spark.localspark import local_spark
    from txsink.testing.pipelines import build_sink, input_stream

    spark = local_spark(master, "txsink-speculation")
    coordinator = Coordinator(
        [build_sink(s) for s in sinks],
        log=str(Path(workdir, "txlog")),
        app_id=app_id,
        faults=_pause_partition_0(hooks, lambda: None).plan(),
    )
    query = (
        input_stream(spark, workdir, 2)
        .writeStream.foreachBatch(coordinator)
        .option("checkpointLocation", str(Path(workdir, "checkpoint")))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        spark.stop()


def _pause_partition_0(folder: str | Path, action: Any) -> PointHooks:
    """The one hook, the same in the child (its plan) and in the test (its callback)."""
    hooks = PointHooks(folder)
    hooks.at("after_precommit", action, epoch=0, partition=0)
    return hooks


class Held:
    """What the hook's callback saw while partition 0's first attempt was paused.

    (No dataclass: txsink.runner loads this file without registering it in
    ``sys.modules``, where ``dataclasses`` looks the module up.)"""

    def __init__(self) -> None:
        self.committed_while_paused = False
        self.waited_s = 0.0


def _hold_until_committed(log_path: Path, held: Held) -> Any:
    def hold() -> None:
        began = time.monotonic()
        log = open_log(log_path)
        while time.monotonic() - began < HOLD_S:
            if log.committed(0) is not None:
                held.committed_while_paused = True
                break
            time.sleep(0.05)
        held.waited_s = time.monotonic() - began

    return hold


def _child_env(cluster: Cluster, targets: list[RunTarget]) -> dict[str, str]:
    confs = {**driver_conf(cluster), **SPECULATION}
    # PySpark splits PYSPARK_SUBMIT_ARGS with shlex: values with spaces stay quoted.
    submit = " ".join(f"--conf {shlex.quote(f'{k}={v}')}" for k, v in confs.items())
    env = dict(os.environ)
    for target in targets:
        env.update(target.child_env())
    here = str(Path(__file__).resolve().parent)
    env.update(
        PYSPARK_SUBMIT_ARGS=f"{submit} pyspark-shell",
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")])),
    )
    env.pop("TXSINK_FAULT", None)
    return env


def new_targets(
    request: pytest.FixtureRequest, tmp: Path, variants: list[tuple[str, str]]
) -> list[RunTarget]:
    """A fresh target per ``(connector, variant)``, dropped after the test."""
    # Imported here: the child driver loads this file too, and there ``conftest`` is the
    # root one (the child's working directory comes first on its path).
    from conftest import variant_target

    return [variant_target(request, tmp, c, v, tag="spec") for c, v in variants]


def run_speculative(
    cluster: Cluster, workdir: Path, targets: list[RunTarget]
) -> tuple[list[str], Held, str]:
    """Run the query once on ``cluster`` with partition 0's first attempt held; check
    the targets; return the driver's lines, what the hook saw and the app id."""
    make_input(workdir / "input", ROWS_PER_EPOCH * EPOCHS, EPOCHS)
    app_id = f"spec_{uuid.uuid4().hex[:8]}"
    held = Held()
    hooks = _pause_partition_0(workdir / "hooks", _hold_until_committed(workdir / "txlog", held))
    args = {
        "workdir": str(workdir),
        "sinks": [t.spec for t in targets],
        "master": cluster.master_url,
        "app_id": app_id,
        "hooks": str(workdir / "hooks"),
    }
    cmd = [
        sys.executable,
        "-m",
        "txsink.runner",
        f"{Path(__file__).resolve()}:speculative_stream",
        json.dumps(args),
    ]
    lines: list[str] = []
    with hooks:
        report = run_until_done(
            cmd, env=_child_env(cluster, targets), max_runs=1, on_line=lines.append, timeout=240
        )
    context = "\n".join(lines[-60:])
    sys.stderr.write(
        f"\nspeculation: query {report.seconds:.1f}s, partition 0 held {held.waited_s:.1f}s\n"
    )
    assert report.finished, f"the query failed ({report.exit_codes}):\n{context}"
    assert [i for i, _ in hooks.fired] == [0], f"partition 0 never paused:\n{context}"
    assert hooks.errors == [], hooks.errors
    assert held.committed_while_paused, (
        f"epoch 0 did not commit in {held.waited_s:.0f}s while partition 0's first attempt "
        f"was paused: Spark launched no speculative copy\n{context}"
    )
    ids = range(ROWS_PER_EPOCH * EPOCHS)
    log = str(workdir / "txlog")
    for target in targets:
        verdict = verify(target.verifier(ids, log=log))
        assert (verdict.duplicates, verdict.missing, verdict.unexpected, verdict.lingering) == (
            0,
            0,
            0,
            0,
        ), (target.uid, verdict)
    states = open_log(workdir / "txlog").states()
    assert [s.status for s in states] == ["committed"] * EPOCHS, states
    assert open_log(workdir / "txlog").pending() == []
    return lines, held, app_id


def assert_loser_aborted(lines: list[str], workdir: Path, targets: list[RunTarget]) -> None:
    """Each sink's paused attempt of partition 0 was prepared, not decided, and aborted."""
    aborted = [
        TxnId.parse(m["txn"]) for m in map(_ABORT_LINE.search, lines) if m and m["epoch"] == "0"
    ]
    decision = open_log(workdir / "txlog").decision(0)
    assert decision is not None
    decided = [TxnId.parse(name) for name in decision.txn_names()]
    for target in targets:
        losers = [t for t in aborted if t.uid == target.uid and t.partition == 0]
        assert len(losers) == 1, (target.uid, aborted, lines[-60:])
        (loser,) = losers
        (winner,) = [t for t in decided if t.uid == target.uid and t.partition == 0]
        assert (winner.epoch, winner.round) == (loser.epoch, loser.round) == (0, 0)
        assert winner.attempt != loser.attempt, (winner, loser)


def assert_no_prepared_xacts(postgres: Any, app_id: str) -> None:
    """Nothing of the run's app left in PostgreSQL's ``pg_prepared_xacts``."""
    with postgres.connect() as conn:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (f"txsink.{app_id}.",)
        ).fetchall()
    assert rows == [], rows


# -- default profile: one cell, files + PostgreSQL in one coordinator ---------------------


@pytest.mark.postgres
def test_speculative_attempt_aborted_files_and_postgres(
    speculation_cluster: Cluster,
    request: pytest.FixtureRequest,
    postgres: Any,
    tmp_path: Path,
) -> None:
    """Partition 0's first attempt prepares into PostgreSQL and the files sink and is held;
    Spark's speculative copy prepares, its result decides epoch 0, the held attempt's two
    transactions are aborted; every id once in each target, nothing prepared left."""
    targets = new_targets(request, tmp_path, [("postgres", "append"), ("files", "parquet")])
    lines, _, app_id = run_speculative(speculation_cluster, tmp_path, targets)
    assert_loser_aborted(lines, tmp_path, targets)
    assert_no_prepared_xacts(postgres, app_id)


# -- more connectors: --run-slow ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.s3
@pytest.mark.parametrize("kafka_variant", ["wal", "replay"])
def test_speculative_attempt_aborted_kafka_and_s3(
    speculation_cluster: Cluster,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    kafka_variant: str,
) -> None:
    """The same with Kafka (``read_committed``: no open transaction left) and S3 (no
    multipart upload left). Kafka's replay mode prepares nothing in Kafka before the
    decision (its commit is a second job over the epoch's rows): its held
    attempt has nothing to abort, and only S3's is."""
    targets = new_targets(request, tmp_path, [("kafka", kafka_variant), ("s3", "parquet")])
    lines, _, _ = run_speculative(speculation_cluster, tmp_path, targets)
    assert_loser_aborted(lines, tmp_path, targets if kafka_variant == "wal" else targets[1:])
