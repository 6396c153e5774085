"""The files connector in real streaming queries on the shared local[2,2] SparkSession.

Faults here are ``raise`` and ``kill-worker`` (in-process restarts of the query);
``kill-driver`` needs a fresh process per crash and lives in test_demo.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.streaming import (
    files_coordinator,
    is_task_point,
    prepare_input,
    run_until_done,
    start_query,
)
from txsink.connectors.files import FilesSink, read_committed
from txsink.connectors.files.testing import verify_files
from txsink.errors import CheckpointMismatchError
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import open_log

pytestmark = pytest.mark.spark
ROWS = 1000


def _assert_exactly_once(workdir: Path, rows: int = ROWS, epochs: int = 4) -> None:
    verdict = verify_files(workdir / "output", range(rows))
    assert verdict.as_dict() == {
        **verdict.as_dict(),
        "duplicates": 0,
        "missing": 0,
        "unexpected": 0,
        "lingering": 0,
        "epochs": epochs,
    }
    log = open_log(workdir / "txlog")
    assert log.pending() == []
    assert [s.status for s in log.states()].count("committed") == epochs


def test_clean_streaming_run(spark: Any, tmp_path: Path) -> None:
    prepare_input(tmp_path, ROWS)
    restarts, _ = run_until_done(spark, tmp_path, lambda: files_coordinator(tmp_path))
    assert restarts == 0
    _assert_exactly_once(tmp_path)


# The crash matrix for files runs with every connector's in integration/test_matrix.py.


@pytest.mark.chaos
@pytest.mark.parametrize("point", ["after_precommit", "before_decision", "after_decision"])
def test_restart_with_another_partition_count(spark: Any, tmp_path: Path, point: str) -> None:
    """Crash at ``point`` of epoch 1 with 2 partitions, restart with 3: recovery commits
    exactly the decided handles (or aborts the prepared ones), whatever the new layout."""
    from pyspark.errors import StreamingQueryException

    from tests.streaming import start_query

    prepare_input(tmp_path, ROWS)
    spec = f"{point}:raise@1" + ("#1*2" if is_task_point(point) else "")
    plan = FaultPlan.parse(spec, str(tmp_path / "faults"))
    query = start_query(spark, tmp_path, files_coordinator(tmp_path, faults=plan))
    with pytest.raises(StreamingQueryException, match="InjectedFault"):
        query.awaitTermination()
    run_until_done(
        spark, tmp_path, lambda: files_coordinator(tmp_path), transform=lambda df: df.repartition(3)
    )
    _assert_exactly_once(tmp_path)


def test_replayed_batch_writes_nothing(spark: Any, tmp_path: Path) -> None:
    coordinator = files_coordinator(tmp_path, app_id="static-app")
    df = spark.range(0, 500).repartition(2)
    coordinator(df, 0)
    files = sorted(p.name for p in (tmp_path / "output").rglob("*.parquet"))
    mtimes = sorted(p.stat().st_mtime_ns for p in (tmp_path / "output").rglob("*.parquet"))
    coordinator(df, 0)  # Spark's replay of the same batch id
    files_coordinator(tmp_path, app_id="static-app")(df, 0)  # and after a restart
    assert sorted(p.name for p in (tmp_path / "output").rglob("*.parquet")) == files
    assert sorted(p.stat().st_mtime_ns for p in (tmp_path / "output").rglob("*.parquet")) == mtimes
    assert read_committed(tmp_path / "output").num_rows == 500


@pytest.mark.matrix("write")
def test_static_write_with_explicit_epoch_is_idempotent(spark: Any, tmp_path: Path) -> None:
    coordinator = files_coordinator(tmp_path, app_id="nightly")
    df = spark.range(0, 300)
    first = coordinator.write(df, epoch=20261122)
    again = files_coordinator(tmp_path, app_id="nightly").write(df, epoch=20261122)
    assert (first.status, again.status) == ("committed", "skipped")
    nxt = coordinator.write(spark.range(300, 400))
    assert nxt.epoch == 20261123
    assert sorted(read_committed(tmp_path / "output").column("id").to_pylist()) == list(range(400))


def test_a_python_worker_freezes_its_heap_after_its_first_txsink_task(
    spark: Any, tmp_path: Path
) -> None:
    """PySpark's daemon collects the garbage after every task of a reused worker, walking
    every object the process holds; after its first txsink task a worker freezes what it
    holds then (the row digest's compiled code among it), so that stays cheap
    (``txsink.spark.jobs.settle_worker_heap``). A job after it finds the workers frozen."""
    import pyarrow as pa

    files_coordinator(tmp_path, app_id="once").write(spark.range(0, 200, numPartitions=2))

    def frozen(batches: Any) -> Any:
        import gc

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"n": [gc.get_freeze_count()]})

    probe = spark.range(0, 2, numPartitions=2).mapInArrow(frozen, "n long")
    assert max(row.n for row in probe.collect()) > 0


@pytest.mark.parametrize("switch", ["on", "off"])
def test_the_worker_heap_freeze_can_be_switched_off(switch: str) -> None:
    """``TXSINK_WORKER_GC_FREEZE=off`` in a worker's environment: nothing frozen (a fresh
    process: freezing is for the process's lifetime)."""
    import os
    import subprocess
    import sys

    code = (
        "import gc\n"
        "from txsink.spark.jobs import settle_worker_heap\n"
        "settle_worker_heap()\n"
        "settle_worker_heap()\n"
        "print(gc.get_freeze_count())\n"
    )
    env = {**os.environ, "TXSINK_WORKER_GC_FREEZE": switch}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    frozen = int(out.stdout.strip())
    assert (frozen > 0) == (switch == "on")


def test_a_write_of_a_committed_epoch_says_so_and_a_replay_says_replay(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 35: write() again for a committed epoch logged "Spark's replay skipped", where
    no Spark replay happened."""
    caplog.set_level(logging.INFO, logger="txsink")
    coordinator = files_coordinator(tmp_path, app_id="nightly")
    df = spark.range(0, 10)
    coordinator.write(df, epoch=7)
    caplog.clear()
    assert coordinator.write(df, epoch=7).status == "skipped"
    told = [r.getMessage() for r in caplog.records if "already committed" in r.getMessage()]
    assert told == [
        "[uid=out epoch=7] already committed: this epoch was committed before, nothing written"
    ]
    caplog.clear()
    coordinator(df, 7)  # foreachBatch: Spark's replay of a batch
    told = [r.getMessage() for r in caplog.records if "already committed" in r.getMessage()]
    assert told == ["[uid=out epoch=7] already committed: Spark's replay skipped"]


def test_sink_alone_as_foreach_batch(spark: Any, tmp_path: Path) -> None:
    prepare_input(tmp_path, ROWS)
    restarts, _ = run_until_done(
        spark,
        tmp_path,
        lambda: FilesSink(tmp_path / "output", uid="out", log=str(tmp_path / "txlog")),
    )
    assert restarts == 0
    _assert_exactly_once(tmp_path)


def test_bad_row_aborts_epoch_then_restart_after_fix(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    prepare_input(tmp_path, ROWS)

    def poison(df: Any) -> Any:  # id 600 (epoch 2) gets a NaN amount: JSON cannot hold it
        return df.withColumn(
            "amount", F.when(F.col("id") == 600, F.lit(float("nan"))).otherwise(F.col("amount"))
        )

    query = start_query(
        spark, tmp_path, files_coordinator(tmp_path, format="jsonl"), transform=poison
    )
    with pytest.raises(Exception) as info:
        query.awaitTermination()
    text = str(info.value)
    assert "EpochAbortedError" in text and "sink_uid=out" in text and "column=amount" in text
    assert "partition=" in text and "NaN" in text
    # Epochs 0 and 1 are committed; nothing of epoch 2 is visible, nothing staged.
    verdict = verify_files(tmp_path / "output", range(500))
    assert (verdict.rows_written, verdict.duplicates, verdict.lingering) == (500, 0, 0)
    assert not (tmp_path / "output" / "epoch=2").exists()

    def fixed(df: Any) -> Any:  # the user's fix: NaN -> null
        return poison(df).withColumn("amount", F.nanvl(F.col("amount"), F.lit(None)))

    restarts, _ = run_until_done(
        spark, tmp_path, lambda: files_coordinator(tmp_path, format="jsonl"), transform=fixed
    )
    assert restarts == 0
    _assert_exactly_once(tmp_path)


def test_csv_with_nested_column_is_refused_before_writing(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    prepare_input(tmp_path, ROWS)
    query = start_query(
        spark,
        tmp_path,
        files_coordinator(tmp_path, format="csv"),
        transform=lambda df: df.withColumn("tags", F.array(F.col("key"))),
    )
    with pytest.raises(Exception, match=r"ConfigurationError.*'tags'.*CSV cannot hold"):
        query.awaitTermination()
    assert not list((tmp_path / "output").rglob("*.csv"))


def test_checkpoint_reset_is_refused(spark: Any, tmp_path: Path) -> None:
    prepare_input(tmp_path, ROWS)
    run_until_done(spark, tmp_path, lambda: files_coordinator(tmp_path))
    # Same txsink log, new checkpoint: a new query id, and epochs restart at 0.
    query = start_query(spark, tmp_path, files_coordinator(tmp_path), checkpoint="checkpoint-2")
    with pytest.raises(Exception, match=r"CheckpointMismatchError.*belongs to app"):
        query.awaitTermination()
    # Keeping the app id on purpose is still refused: epoch 0 < the log's last epoch.
    app = open_log(tmp_path / "txlog").meta()["app_id"]  # type: ignore[index]
    query = start_query(
        spark, tmp_path, files_coordinator(tmp_path, app_id=app), checkpoint="checkpoint-3"
    )
    with pytest.raises(Exception, match=r"CheckpointMismatchError.*checkpoint was reset"):
        query.awaitTermination()
    _assert_exactly_once(tmp_path)


def test_racing_driver_is_fenced_with_real_log(spark: Any, tmp_path: Path) -> None:
    """Driver B replays epoch 0 while A is pre-committing it; A loses, data lands once."""
    from txsink.errors import FencedError
    from txsink.protocol.task import precommit_job
    from txsink.spark.jobs import SparkEpochData

    df = spark.range(0, 200).repartition(2)
    a = files_coordinator(tmp_path, app_id="race")
    b = files_coordinator(tmp_path, app_id="race")
    job = precommit_job(SparkEpochData(df))

    def a_precommit(plan: Any) -> Any:
        acks = job(plan)
        b.run_epoch(0, precommit_job(SparkEpochData(df)), app_id="race")  # recovery voids A's round
        return acks

    with pytest.raises(FencedError):
        a.run_epoch(0, a_precommit, app_id="race")
    verdict = verify_files(tmp_path / "output", range(200))
    assert verdict.ok, verdict
    assert isinstance(CheckpointMismatchError, type)


@pytest.mark.parametrize(("max_tasks", "tasks"), [(None, 6), (4, 4), ("slots", 2), (8, 6)])
def test_max_tasks_coalesces_the_epoch(
    spark: Any, tmp_path: Path, max_tasks: Any, tasks: int
) -> None:
    """``max_tasks`` bounds the pre-commit tasks (one prepared handle, one file each) without
    a shuffle; "slots" is local[2]'s two; a bound above the partitions changes nothing."""
    coordinator = files_coordinator(tmp_path, app_id="coalesced", max_tasks=max_tasks)
    result = coordinator.write(spark.range(0, 600, 1, 6), epoch=0)
    assert (result.status, result.handles) == ("committed", tasks)
    assert len(list((tmp_path / "output").rglob("*.parquet"))) == tasks
    ids = read_committed(tmp_path / "output").column("id").to_pylist()
    assert sorted(ids) == list(range(600))
