"""Savepoints and upgrades end to end: real streaming queries into the files sink.

Each test runs the query, stops it, takes a savepoint or changes the state (rename a uid,
add, remove a sink, change the partition count), starts it again with more input, and
reads the output back through the manifests: every id exactly once, nothing lingering.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.streaming import append_input, prepare_input, start_query
from txsink import Coordinator
from txsink.cli.state import (
    add_savepoint_arguments,
    add_state_arguments,
    savepoint_command,
    state_command,
)
from txsink.connectors.files import FilesSink, read_manifests
from txsink.connectors.files.testing import verify_files
from txsink.errors import SavepointError, StateError
from txsink.ops.savepoint import (
    MANIFEST,
    create_savepoint,
    read_savepoint,
    restore_if_empty,
    restore_savepoint,
)
from txsink.ops.state import rename_uid
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import open_log

pytestmark = pytest.mark.spark
ROWS, FILES = 600, 3


def _run(spark: Any, workdir: Path, coordinator: Any, **options: Any) -> None:
    start_query(spark, workdir, coordinator, **options).awaitTermination()


def _files(workdir: Path, uid: str = "out", folder: str = "output") -> FilesSink:
    return FilesSink(workdir / folder, uid=uid)


def _assert_once(path: Path, ids: range, epochs: int, uid: str | None = None) -> None:
    verdict = verify_files(path, ids, uid=uid)
    assert verdict.ok, verdict
    assert verdict.epochs == epochs, verdict


@pytest.fixture(scope="module")
def committed_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A finished 3-epoch run: input, output, txlog, checkpoint (read-only for the tests)."""
    workdir = tmp_path_factory.mktemp("committed")
    prepare_input(workdir, ROWS, FILES)
    _run(spark, workdir, Coordinator([_files(workdir)], log=str(workdir / "txlog")))
    yield workdir


# -- savepoints -----------------------------------------------------------------------------


def test_savepoint_restore_to_new_log_and_checkpoint_continues_exactly_once(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prepare_input(tmp_path, ROWS, FILES)
    _run(spark, tmp_path, Coordinator([_files(tmp_path)], log=str(tmp_path / "txlog")))

    parser = argparse.ArgumentParser()
    add_savepoint_arguments(parser)
    argv = ["create", "--log", str(tmp_path / "txlog"), "--to", str(tmp_path / "sp")]
    args = parser.parse_args([*argv, "--checkpoint", str(tmp_path / "checkpoint")])
    assert savepoint_command(args) == 0
    assert "last committed epoch 2" in capsys.readouterr().out
    sp = read_savepoint(tmp_path / "sp")
    assert (sp.last_committed, sp.epochs, sp.sinks) == (2, (0, 1, 2), ("out",))
    # Canonical: the meta record, then per epoch only its decision and committed mark.
    assert len(sp.records) == 1 + 2 * FILES
    assert sp.manifest["checkpoint"]["next_batch"] == 3

    restore = ["restore", "--from-savepoint", str(tmp_path / "sp")]
    restore += ["--log", str(tmp_path / "txlog2"), "--checkpoint", str(tmp_path / "ckpt2")]
    assert savepoint_command(parser.parse_args(restore)) == 0
    assert "continues at epoch 3" in capsys.readouterr().out
    # Idempotent: the same restore again changes nothing.
    again = restore_savepoint(tmp_path / "sp", tmp_path / "txlog2", checkpoint=tmp_path / "ckpt2")
    assert again.already and again.records_written == 0
    # Self-contained: the old log and checkpoint are gone for good.
    shutil.rmtree(tmp_path / "txlog")
    shutil.rmtree(tmp_path / "checkpoint")

    append_input(tmp_path / "input", ROWS, 300, FILES, 2)
    coordinator = Coordinator([_files(tmp_path)], log=str(tmp_path / "txlog2"))
    _run(spark, tmp_path, coordinator, checkpoint="ckpt2")
    _assert_once(tmp_path / "output", range(ROWS + 300), FILES + 2)
    log = open_log(tmp_path / "txlog2")
    assert log.last_committed() == FILES + 1 and log.pending() == []


def test_coordinator_from_savepoint_fills_an_empty_log(spark: Any, tmp_path: Path) -> None:
    """``Coordinator(from_savepoint=...)``: the checkpoint restored first (Spark reads it
    before foreachBatch), the log filled on first use, then exactly once onwards."""
    prepare_input(tmp_path, ROWS, FILES)
    _run(spark, tmp_path, Coordinator([_files(tmp_path)], log=str(tmp_path / "txlog")))
    create_savepoint(tmp_path / "txlog", tmp_path / "sp", checkpoint=tmp_path / "checkpoint")
    restore_savepoint(tmp_path / "sp", tmp_path / "scratch", checkpoint=tmp_path / "ckpt2")
    shutil.rmtree(tmp_path / "txlog")
    shutil.rmtree(tmp_path / "checkpoint")

    append_input(tmp_path / "input", ROWS, 300, FILES, 2)
    coordinator = Coordinator(
        [_files(tmp_path)], log=str(tmp_path / "txlog2"), from_savepoint=str(tmp_path / "sp")
    )
    _run(spark, tmp_path, coordinator, checkpoint="ckpt2")
    _assert_once(tmp_path / "output", range(ROWS + 300), FILES + 2)
    log = open_log(tmp_path / "txlog2")
    assert log.last_committed() == FILES + 1 and log.pending() == []
    # Run again: the log has moved on since the savepoint, and is left alone.
    again = Coordinator(
        [_files(tmp_path)], log=str(tmp_path / "txlog2"), from_savepoint=str(tmp_path / "sp")
    )
    _run(spark, tmp_path, again, checkpoint="ckpt2")
    assert open_log(tmp_path / "txlog2").last_committed() == FILES + 1


def test_savepoint_refused_while_an_epoch_is_decided_not_committed(
    spark: Any, tmp_path: Path
) -> None:
    prepare_input(tmp_path, ROWS, FILES)
    plan = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    with pytest.raises(Exception, match="InjectedFault"):
        _run(
            spark,
            tmp_path,
            Coordinator([_files(tmp_path)], log=str(tmp_path / "txlog"), faults=plan),
        )
    with pytest.raises(SavepointError, match=r"epoch\(s\) \[1\] decided but not yet committed"):
        create_savepoint(tmp_path / "txlog", tmp_path / "sp")
    assert not (tmp_path / "sp").exists()
    # The restart's recovery finishes epoch 1; then the savepoint is taken.
    _run(spark, tmp_path, Coordinator([_files(tmp_path)], log=str(tmp_path / "txlog")))
    _assert_once(tmp_path / "output", range(ROWS), FILES)
    sp = create_savepoint(tmp_path / "txlog", tmp_path / "sp", checkpoint=tmp_path / "checkpoint")
    assert sp.last_committed == FILES - 1


def test_open_and_aborted_epochs(committed_run: Path, tmp_path: Path) -> None:
    """An open epoch (a query may be running) is refused; an aborted one is kept whole."""
    shutil.copytree(committed_run / "txlog", tmp_path / "txlog")
    log = open_log(tmp_path / "txlog")
    round_ = log.claim_round(3)
    with pytest.raises(SavepointError, match="epoch 3 round 0 claimed by host"):
        create_savepoint(log, tmp_path / "sp")
    log.void(3, round_, "pre-commit failed")
    sp = create_savepoint(log, tmp_path / "sp")
    keys = {str(r["key"]) for r in sp.records}
    assert {"epochs/00000000000000000003/claim-000000.json"} <= keys
    assert sp.last_committed == 2 and sp.epochs == (0, 1, 2)
    # Restored, the aborted epoch's round 0 stays taken: the next run claims round 1.
    restore_savepoint(tmp_path / "sp", tmp_path / "txlog2")
    assert open_log(tmp_path / "txlog2").claim_round(3) == 1


def test_incomplete_or_foreign_savepoints_are_refused(committed_run: Path, tmp_path: Path) -> None:
    sp = create_savepoint(committed_run / "txlog", tmp_path / "sp")
    with pytest.raises(SavepointError, match="is not empty"):
        create_savepoint(committed_run / "txlog", tmp_path / "sp")
    # A record missing (a copy cut short, or a file lost on the way).
    shutil.copytree(tmp_path / "sp", tmp_path / "cut")
    decision = next(str(r["key"]) for r in sp.records if "decision-" in str(r["key"]))
    (tmp_path / "cut" / decision).unlink()
    with pytest.raises(SavepointError, match="incomplete or damaged: 1 of its records"):
        restore_savepoint(tmp_path / "cut", tmp_path / "log-a")
    assert not (tmp_path / "log-a").exists()
    # No manifest: the copy stopped before it was written.
    (tmp_path / "cut" / MANIFEST).unlink()
    with pytest.raises(SavepointError, match="incomplete savepoint"):
        restore_savepoint(tmp_path / "cut", tmp_path / "log-a")
    # A format version this txsink cannot read.
    shutil.copytree(tmp_path / "sp", tmp_path / "v9")
    doc = json.loads((tmp_path / "v9" / MANIFEST).read_text())
    (tmp_path / "v9" / MANIFEST).write_text(json.dumps({**doc, "version": 9}))
    with pytest.raises(SavepointError, match=r"format version 9.*savepoint version 1"):
        restore_savepoint(tmp_path / "v9", tmp_path / "log-a")
    # A log location holding something else.
    with pytest.raises(SavepointError, match="not empty and does not hold this savepoint"):
        restore_savepoint(tmp_path / "sp", committed_run / "txlog")
    # A restore cut short is completed by the next one (or by from_savepoint's hook).
    restore_savepoint(tmp_path / "sp", tmp_path / "log-b")
    for key in ("restored-from-savepoint.json", decision):
        (tmp_path / "log-b" / key).unlink()
    assert restore_if_empty(tmp_path / "sp", tmp_path / "log-b")
    assert not restore_if_empty(tmp_path / "sp", tmp_path / "log-b")
    assert open_log(tmp_path / "log-b").last_committed() == 2
    with pytest.raises(SavepointError, match="no Spark checkpoint"):
        restore_savepoint(tmp_path / "sp", tmp_path / "log-b", checkpoint=tmp_path / "ck")


def test_checkpoint_that_does_not_match_the_log_is_refused(
    committed_run: Path, tmp_path: Path
) -> None:
    shutil.copytree(committed_run / "checkpoint", tmp_path / "ck")
    # Older than the log: Spark would restart at batch 1, the log committed up to 2.
    for batch in ("1", "2"):
        (tmp_path / "ck" / "offsets" / batch).unlink()
        (tmp_path / "ck" / "commits" / batch).unlink()
    with pytest.raises(SavepointError, match=r"restart at batch 1.*older than the log"):
        create_savepoint(committed_run / "txlog", tmp_path / "sp", checkpoint=tmp_path / "ck")
    # Another query's checkpoint.
    meta = tmp_path / "ck" / "metadata"
    meta.write_text(json.dumps({"id": "00000000-0000-0000-0000-000000000000"}) + "\n")
    with pytest.raises(SavepointError, match="belongs to query"):
        create_savepoint(committed_run / "txlog", tmp_path / "sp", checkpoint=tmp_path / "ck")
    assert not (tmp_path / "sp").exists()


def test_partition_count_changes_across_a_savepoint_restore(spark: Any, tmp_path: Path) -> None:
    prepare_input(tmp_path, 400, 2)
    _run(spark, tmp_path, Coordinator([_files(tmp_path)], log=str(tmp_path / "txlog")))
    create_savepoint(tmp_path / "txlog", tmp_path / "sp", checkpoint=tmp_path / "checkpoint")
    restore_savepoint(tmp_path / "sp", tmp_path / "txlog2", checkpoint=tmp_path / "ckpt2")
    append_input(tmp_path / "input", 400, 400, 2, 2)
    coordinator = Coordinator([_files(tmp_path)], log=str(tmp_path / "txlog2"))
    _run(spark, tmp_path, coordinator, checkpoint="ckpt2", transform=lambda df: df.repartition(3))
    _assert_once(tmp_path / "output", range(800), 4)
    log = open_log(tmp_path / "txlog2")
    parts = {
        e: {h["data"]["txn"].split(".p")[1].split(".")[0] for h in dec.handles["out"]}
        for e in (1, 3)
        if (dec := log.decision(e)) is not None
    }
    assert (len(parts[1]), len(parts[3])) == (2, 3), parts


# -- upgrades -------------------------------------------------------------------------------


def test_rename_uid_then_continue(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prepare_input(tmp_path, ROWS, FILES)
    log_path = str(tmp_path / "txlog")
    _run(spark, tmp_path, Coordinator([_files(tmp_path)], log=log_path))
    # A lingering stage of the old uid (a crashed task's leftover): the rename aborts it.
    app = open_log(log_path).meta()["app_id"]  # type: ignore[index]
    stray = tmp_path / "output" / "_txsink" / "staging" / f"txsink.{app}.out.e2.r5.p0.a9"
    stray.mkdir(parents=True)

    parser = argparse.ArgumentParser()
    add_state_arguments(parser)
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(
        "from txsink.connectors.files import FilesSink\n\n\n"
        f"def sinks():\n    return [FilesSink({str(tmp_path / 'output')!r}, uid='events')]\n"
    )
    argv = ["rename-uid", "--log", log_path, "--from", "out", "--to", "events"]
    argv += ["--pipeline", f"{pipeline}:sinks"]
    assert state_command(parser.parse_args([*argv, "--dry-run"])) == 0
    out = capsys.readouterr().out
    assert "would abort 1 lingering" in out and "would move 3 epoch manifest" in out
    assert "would rewrite the decisions of 3 epoch(s)" in out
    assert "moving the handles of 'out' to 'events'" in out and "'out''s" not in out
    assert open_log(log_path).decision(0).handles.keys() == {"out"}  # type: ignore[union-attr]

    assert state_command(parser.parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert "aborted 1 lingering" in out and "moved 3 epoch manifest" in out
    log = open_log(log_path)
    assert all(log.decision(e).handles.keys() == {"events"} for e in range(FILES))  # type: ignore[union-attr]
    assert [d["epoch"] for d in read_manifests(tmp_path / "output", "events")] == [0, 1, 2]
    assert read_manifests(tmp_path / "output", "out") == []
    assert not stray.exists()
    with pytest.raises(StateError, match="'out' is not in the retained epochs"):
        rename_uid(log_path, "out", "other")
    with pytest.raises(StateError, match="'events' is already used"):
        rename_uid(log_path, "other", "events")

    append_input(tmp_path / "input", ROWS, 300, FILES, 2)
    _run(spark, tmp_path, Coordinator([_files(tmp_path, uid="events")], log=log_path))
    # Readers by the new uid see the old epochs too; nothing twice, nothing left over.
    _assert_once(tmp_path / "output", range(ROWS + 300), FILES + 2, uid="events")
    _assert_once(tmp_path / "output", range(ROWS + 300), FILES + 2)


def test_rename_resumes_after_a_crash_between_delete_and_create(
    committed_run: Path, tmp_path: Path
) -> None:
    shutil.copytree(committed_run / "txlog", tmp_path / "txlog")
    log = open_log(tmp_path / "txlog")
    # As if a rename died in epoch 1: journal written, the side record written, the old
    # decision deleted, the new one not yet created.
    from txsink.ops.state import JOURNAL, _renamed

    log.store.create(JOURNAL, json.dumps({"old": "out", "new": "events"}).encode())
    dec_key = f"epochs/{1:020d}/decision-{log.decision(1).round:06d}.json"  # type: ignore[union-attr]
    raw = log.store.read(dec_key)
    assert raw is not None
    log.store.create(
        dec_key.replace("decision-", "rewrite-"), _renamed(json.loads(raw), "out", "events")
    )
    log.store.delete(dec_key)
    with pytest.raises(SavepointError, match="unfinished state upgrade"):
        create_savepoint(log, tmp_path / "sp")
    with pytest.raises(StateError, match="unfinished rename 'out' -> 'events'"):
        rename_uid(log, "out", "x")
    report = rename_uid(log, "out", "events")
    assert report.resumed
    assert [set(log.decision(e).handles) for e in range(FILES)] == [{"events"}] * FILES  # type: ignore[union-attr]
    assert log.store.list("upgrades/") == []
    assert not any("rewrite-" in k for k in log.store.list("epochs/"))


def test_add_a_sink(spark: Any, tmp_path: Path) -> None:
    """A new uid joins at the next epoch; earlier epochs are not backfilled."""
    prepare_input(tmp_path, 400, 2)
    log_path = str(tmp_path / "txlog")
    _run(spark, tmp_path, Coordinator([_files(tmp_path, "a", "out-a")], log=log_path))
    append_input(tmp_path / "input", 400, 200, 2, 1)
    sinks = [_files(tmp_path, "a", "out-a"), _files(tmp_path, "b", "out-b")]
    _run(spark, tmp_path, Coordinator(sinks, log=log_path))
    _assert_once(tmp_path / "out-a", range(600), 3)
    _assert_once(tmp_path / "out-b", range(400, 600), 1)
    assert [d["epoch"] for d in read_manifests(tmp_path / "out-b")] == [2]
    log = open_log(log_path)
    assert [sorted(log.decision(e).handles) for e in range(3)] == [  # type: ignore[union-attr]
        ["a"],
        ["a"],
        ["a", "b"],
    ]


def test_remove_a_sink_with_pending_state(spark: Any, tmp_path: Path) -> None:
    """Epoch 1 decided with handles of sinks a and b; restart with a only."""
    from pyspark.errors import StreamingQueryException

    prepare_input(tmp_path, ROWS, FILES)
    log_path = str(tmp_path / "txlog")
    plan = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    both = [_files(tmp_path, "a", "out-a"), _files(tmp_path, "b", "out-b")]
    with pytest.raises(StreamingQueryException, match="InjectedFault"):
        _run(spark, tmp_path, Coordinator(both, log=log_path, faults=plan))
    assert [d.epoch for d in open_log(log_path).pending()] == [1]

    only_a = [_files(tmp_path, "a", "out-a")]
    with pytest.raises(StreamingQueryException, match="allow_non_restored_state=True"):
        _run(spark, tmp_path, Coordinator(only_a, log=log_path))
    _run(spark, tmp_path, Coordinator(only_a, log=log_path, allow_non_restored_state=True))

    _assert_once(tmp_path / "out-a", range(ROWS), FILES)
    log = open_log(log_path)
    assert log.committed(1).not_restored == ("b",)  # type: ignore[union-attr]
    # b has epoch 0 only; its prepared part of epoch 1 was skipped and is still staged
    # (aborting it is `txsink abort`'s job), so nothing of it is visible.
    verdict = verify_files(tmp_path / "out-b", range(ROWS))
    assert (verdict.epochs, verdict.duplicates, verdict.unexpected) == (1, 0, 0)
    assert verdict.rows_written == ROWS // FILES and verdict.lingering > 0
