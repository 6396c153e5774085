"""``txsink recover`` / ``txsink abort`` by hand against real Kafka (WAL), Postgres and S3.

One coordinator over the three cross-system sinks crashes after its decision of epoch 1,
with a leftover attempt of a retried task prepared in every target, and a dead driver's
undecided pre-commit of epoch 2 prepared in every target too. The operator commands,
over a ``--pipeline`` file that builds the same sinks from environment variables, then:
a dry run changes nothing in any target; ``abort --epoch 1`` refuses the decided epoch;
``abort`` releases the undecided ones; ``recover`` commits the decision. Nothing lingers
(no prepared Postgres transaction, no open Kafka transaction or WAL file, no multipart
upload), and the restarted query finishes exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from cross import Cross

from txsink.cli.operate import (
    abort_command,
    add_abort_arguments,
    add_recover_arguments,
    recover_command,
)
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import open_log
from txsink.testing.verifiers import Verdict
from txsink.txid import TxnId

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.s3, pytest.mark.spark]

ROWS, FILES = 400, 4
PIPELINE = """\
import json

from txsink.testing.pipelines import build_sink

SPECS = json.loads({specs!r})


def sinks():
    return [build_sink(spec) for spec in SPECS]
"""


def _args(add: Any, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add(parser)
    return parser.parse_args(list(argv))


def _prepare_undecided(cross: Cross, epoch: int) -> None:
    """What a driver that died after pre-committing ``epoch`` leaves in every target."""
    log = open_log(cross.log)
    meta = log.meta()
    assert meta is not None
    round_ = log.claim_round(epoch)
    batch = pa.RecordBatch.from_pydict(
        {
            "id": pa.array([10_000 + i for i in range(3)], pa.int64()),
            "key": pa.array(["k0", "k1", "k2"]),
            "amount": pa.array([1.0, 2.0, 3.0]),
            "payload": pa.array(["x", "y", "z"]),
        }
    )
    for sink in cross.sinks():
        sink.check(batch.schema, meta["app_id"])
        txn = sink.begin(TxnId(meta["app_id"], sink.uid, epoch, round_, 0, 0), batch.schema)
        sink.write(txn, batch)
        sink.prepare(txn)


def _lingering(verdicts: dict[str, Verdict]) -> dict[str, int]:
    return {name: v.lingering for name, v in verdicts.items()}


def test_recover_and_abort_by_hand_on_real_targets(
    spark: Any,
    cross: Cross,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pyspark.errors import StreamingQueryException

    from tests.streaming import prepare_input, run_until_done, start_query

    prepare_input(tmp_path, ROWS, FILES)
    faults = FaultPlan.parse(
        "after_precommit:raise@1#1,after_decision:raise@1", str(tmp_path / "faults")
    )
    query = start_query(spark, tmp_path, cross.coordinator(faults))
    with pytest.raises(StreamingQueryException):
        query.awaitTermination()
    assert len(faults.fired()) == 2
    _prepare_undecided(cross, 2)

    for key, value in cross.child_env().items():
        monkeypatch.setenv(key, value)
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(PIPELINE.format(specs=json.dumps(cross.specs())))
    common = ("--log", cross.log, "--pipeline", f"{pipeline}:sinks")

    before = cross.verdicts(ROWS)
    # epoch 1's leftover attempt and epoch 2's pre-commit in each target; epoch 1's decided
    # handles too (Postgres, S3; Kafka WAL files)
    assert all(n >= 2 for n in _lingering(before).values()), before
    log_before = sorted(open_log(cross.log).store.list(""))
    capsys.readouterr()
    assert recover_command(_args(add_recover_arguments, *common, "--dry-run")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("txsink recover (dry run: nothing changed): would commit")
    assert any(line.startswith("would void round 0 of epoch 2") for line in out)
    after = cross.verdicts(ROWS)
    assert {n: v.as_dict() for n, v in after.items()} == {
        n: v.as_dict() for n, v in before.items()
    }, "the dry run changed a target"
    assert sorted(open_log(cross.log).store.list("")) == log_before

    assert abort_command(_args(add_abort_arguments, *common, "--epoch", "1")) == 1
    assert "epoch 1 is decided" in capsys.readouterr().err
    assert abort_command(_args(add_abort_arguments, *common)) == 0
    out = capsys.readouterr().out.splitlines()
    aborted = [line for line in out if line.startswith("aborted ")]
    assert {line.split(" ")[1] for line in aborted} == set(cross.uids.values())
    assert recover_command(_args(add_recover_arguments, *common)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("txsink recover: committed"), out
    assert _lingering(cross.verdicts(ROWS)) == dict.fromkeys(cross.uids, 0)
    assert open_log(cross.log).pending() == []
    with cross.services["postgres"].connect() as conn:
        gids = [gid for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts")]
    assert not [g for g in gids if f".{cross.uids['postgres']}." in g], gids

    restarts, _ = run_until_done(spark, tmp_path, cross.coordinator)
    assert restarts == 0
    verdicts = cross.verdicts(ROWS)
    assert all(v.ok for v in verdicts.values()), verdicts
    assert os.listdir(cross.targets["kafka"].spec["wal"]) == []
