"""txsink.ops.inspect (log as tables), txsink.ops.report (HTML report) and ``txsink inspect``.

The main log is real: the files sink in a streaming query on the shared session, with a
crash after the decision of epoch 1 (recovery finishes it) and a pre-commit that fails
twice in epoch 2 (its round 0 is voided, round 1 decides). Small synthetic logs written
through :class:`~txsink.protocol.log.TxLog` cover what a finished query never leaves behind: a
decided-but-uncommitted epoch, a claimed round, an aborted epoch.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.streaming import files_coordinator, prepare_input, run_until_done
from txsink.cli import inspect as cli_inspect
from txsink.connectors.files import FilesHandle
from txsink.errors import LogError
from txsink.ops.inspect import (
    EPOCH_COLUMNS,
    LOG_COLUMNS,
    EpochRecords,
    LogSnapshot,
    epoch_table,
    log_table,
    read_log,
    spark_log_table,
    spark_schema,
)
from txsink.ops.report import CHART_EPOCHS, render_report
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import FileStore, TxLog, open_log
from txsink.txid import check_name

ROWS = 1000
APP = "app-1"
SECTIONS = ("summary", "timeline", "latency", "pending", "voided", "lingering", "sinks")


# -- logs -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_log(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished streaming run (4 epochs) with one driver crash and one aborted round."""
    workdir = tmp_path_factory.mktemp("inspect")
    prepare_input(workdir, ROWS)
    plan = FaultPlan.parse(
        "after_decision:raise@1,before_precommit:raise@2#1*2", str(workdir / "faults")
    )
    restarts, _ = run_until_done(spark, workdir, lambda: files_coordinator(workdir, faults=plan))
    assert len(plan.fired()) == 3, "a fault never fired: the log is not what the tests expect"
    assert restarts == 2
    return workdir


def _handle(uid: str, epoch: int, round_: int, partition: int, rows: int) -> dict[str, Any]:
    txn = f"txsink.{APP}.{uid}.e{epoch}.r{round_}.p{partition}.a{partition + 7}"
    return {
        "serializer": "files.staged",
        "version": 1,
        "data": {"txn": txn, "rows": rows, "nbytes": rows * 100, "files": []},
    }


def synthetic_log(path: Path) -> TxLog:
    """Epoch 0 committed; 1 decided, not committed; 2 aborted; 3 one void + one claimed round."""
    log = open_log(path)
    log.bind_app(APP)
    log.claim_round(0)
    log.decide(0, 0, {"a": [_handle("a", 0, 0, p, 5) for p in range(2)], "b": []}, {})
    log.mark_committed(0, 0, not_restored=("b",))
    log.claim_round(1)
    log.decide(
        1,
        0,
        {"a": [_handle("a", 1, 0, 0, 3)], "b": [_handle("b", 1, 0, 0, 4)]},
        {"rows": {"a": 3, "b": 4}, "seconds": {"precommit": 0.25}},
    )
    log.claim_round(2)
    log.void(2, 0, "pre-commit failed <script>alert(1)</script>")
    log.claim_round(3)
    log.void(3, 0, "aborted by recovery")
    log.claim_round(3)
    return log


class CountingStore(FileStore):
    """A FileStore that counts calls, to check the log is read once."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: dict[str, int] = {}
        self.lists: list[str] = []

    def read(self, key: str) -> bytes | None:
        self.reads[key] = self.reads.get(key, 0) + 1
        return super().read(key)

    def list(self, prefix: str) -> list[str]:
        self.lists.append(prefix)
        return super().list(prefix)


def _run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli_inspect.add_arguments(parser)
    return cli_inspect.inspect_command(parser.parse_args(list(argv)))


def _section(page: str, section_id: str) -> str:
    m = re.search(rf'<(section|header) id="{section_id}">(.*?)</\1>', page, re.S)
    assert m is not None, f"no section {section_id}"
    return m.group(2)


# -- tables of the real log -------------------------------------------------------------


@pytest.mark.spark
def test_log_table_of_a_real_run(real_log: Path) -> None:
    df = log_table(real_log / "txlog")
    assert list(df.columns) == list(LOG_COLUMNS)
    handles = df[df["sink_uid"].notna()]
    assert set(handles["sink_uid"]) == {"out"}
    assert set(handles["serializer"]) == {"files.staged"}
    assert set(handles["handle_version"]) == {FilesHandle.version}
    assert set(handles["round_status"]) == {"decided"}
    assert set(df["epoch_status"]) == {"committed"}
    assert int(handles["rows"].sum()) == ROWS
    assert (handles["bytes"] > 0).all()
    assert set(handles["partition"]) == {0, 1}
    assert handles["txn"].map(lambda t: t.startswith("txsink.")).all()
    for column in ("claimed_at", "decided_at", "committed_at", "voided_at"):
        assert str(df[column].dt.tz) == "UTC"
    assert (handles["commit_latency_s"] >= 0).all()
    assert (handles["precommit_s"] > 0).all()
    assert (handles["committed_at"] >= handles["decided_at"]).all()
    assert not df["not_restored"].any()
    # Epoch 2's first pre-commit failed: round 0 voided without handles, round 1 decided.
    voided = df[df["round_status"] == "void"]
    assert voided[["epoch", "round"]].values.tolist() == [[2, 0]]
    assert voided["sink_uid"].isna().all()
    assert voided["void_reason"].tolist() == ["pre-commit failed"]
    assert voided["voided_at"].notna().all()
    assert set(handles.loc[handles["epoch"] == 2, "round"]) == {1}
    # Epoch 1 was finished by the restart's recovery: its commit waited for the restart.
    lat = handles.groupby("epoch")["commit_latency_s"].first()
    assert lat[1] > lat[0]


@pytest.mark.spark
def test_epoch_table_of_a_real_run(real_log: Path) -> None:
    df = epoch_table(real_log / "txlog")
    assert list(df.columns) == list(EPOCH_COLUMNS)
    assert df["epoch"].tolist() == [0, 1, 2, 3]
    assert set(df["status"]) == {"committed"}
    assert int(df["rows"].sum()) == ROWS
    assert df.set_index("epoch")["rounds"].to_dict() == {0: 1, 1: 1, 2: 2, 3: 1}
    assert df.set_index("epoch")["voided_rounds"].to_dict() == {0: 0, 1: 0, 2: 1, 3: 0}
    assert df.loc[df["epoch"] == 2, "decided_round"].tolist() == [1]
    assert (df["handles"] >= 1).all() and (df["sinks"] == 1).all()
    assert (df["commit_latency_s"] >= 0).all() and (df["precommit_s"] > 0).all()
    assert (df["committed_at"] >= df["claimed_at"]).all()
    # The same statuses the log's own reader gives.
    log = open_log(real_log / "txlog")
    assert df["status"].tolist() == [s.status for s in log.states()]


@pytest.mark.spark
def test_spark_log_table(spark: Any, real_log: Path) -> None:
    from pyspark.sql import types as T

    sdf = spark_log_table(spark, str(real_log / "txlog"))
    assert sdf.schema == spark_schema()
    assert isinstance(sdf.schema["claimed_at"].dataType, T.TimestampType)
    assert isinstance(sdf.schema["rows"].dataType, T.LongType)
    pdf = log_table(real_log / "txlog")
    assert sdf.count() == len(pdf)
    assert sdf.where("sink_uid = 'out'").agg({"rows": "sum"}).collect()[0][0] == ROWS
    # Timestamps are the same instants (as seconds since the epoch: no time zone involved).
    got = sdf.where("txn IS NOT NULL").selectExpr("txn", "cast(committed_at AS double) AS c")
    seconds = {r["txn"]: r["c"] for r in got.collect()}
    handles = pdf[pdf["txn"].notna()]
    stamps = handles["committed_at"].map(pd.Timestamp.timestamp)
    want = dict(zip(handles["txn"], stamps, strict=True))
    assert seconds.keys() == want.keys()
    assert all(abs(seconds[t] - want[t]) < 1e-3 for t in want)


# -- reading ------------------------------------------------------------------------------


def test_every_record_is_read_once(tmp_path: Path) -> None:
    synthetic_log(tmp_path / "log")
    store = CountingStore(tmp_path / "log")
    snap = read_log(TxLog(store))
    log_table(snap), epoch_table(snap), render_report(snap)
    assert store.lists == ["epochs/"]
    assert store.reads and max(store.reads.values()) == 1
    assert len(store.reads) == len(store.list("epochs/")) + 1  # + meta.json
    # A store, a TxLog, a path and a snapshot read the same.
    frames = [log_table(x) for x in (store, TxLog(store), str(tmp_path / "log"), snap)]
    for other in frames[1:]:
        pd.testing.assert_frame_equal(frames[0], other)


def test_no_log_is_an_actionable_error(tmp_path: Path) -> None:
    with pytest.raises(LogError, match=r"no txsink log at .*meta\.json is missing"):
        log_table(tmp_path / "nothing")
    assert _run_cli("--log", str(tmp_path / "nothing"), "--out", str(tmp_path / "r.html")) == 1
    assert not (tmp_path / "r.html").exists()


def test_statuses_of_unfinished_epochs(tmp_path: Path) -> None:
    log = synthetic_log(tmp_path / "log")
    df = log_table(tmp_path / "log")
    by_epoch = df.groupby("epoch")["epoch_status"].first().to_dict()
    assert by_epoch == {0: "committed", 1: "decided", 2: "aborted", 3: "open"}
    assert by_epoch == {s.epoch: s.status for s in log.states()}
    assert df.loc[df["epoch"] == 3, "round_status"].tolist() == ["void", "claimed"]
    # Epoch 0 was committed without sink b (allow_non_restored_state): only b is flagged.
    e0 = df[df["epoch"] == 0]
    assert e0["sink_uid"].tolist() == ["a", "a"]
    assert not e0["not_restored"].any()
    assert epoch_table(log).set_index("epoch").loc[0, "not_restored"] == "b"
    # Epoch 1 is decided: no commit time, no latency; pre-commit time from the stats.
    e1 = df[df["epoch"] == 1]
    assert e1["committed_at"].isna().all() and e1["commit_latency_s"].isna().all()
    assert e1["precommit_s"].tolist() == [0.25, 0.25]
    assert e1["rows"].tolist() == [3, 4] and e1["bytes"].tolist() == [300, 400]
    assert e1["attempt"].tolist() == [7, 7]
    assert read_log(log).decided_txns() >= set(e1["txn"])


def test_empty_log_gives_empty_typed_tables(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log")
    log.bind_app(APP)
    df, ep = log_table(log), epoch_table(log)
    assert df.empty and ep.empty
    assert str(df["claimed_at"].dtype) == "datetime64[ns, UTC]"
    assert str(df["rows"].dtype) == "Int64"
    page = render_report(log)
    assert "The log holds no epochs yet" in page


# -- the report ---------------------------------------------------------------------------


@pytest.mark.spark
def test_report_of_a_real_run(real_log: Path, tmp_path: Path) -> None:
    # A log location with characters HTML must escape (sink uids cannot have any).
    with pytest.raises(ValueError):
        check_name("sink uid", "a<b")
    odd = tmp_path / 'log <b>&"x'
    shutil.copytree(real_log / "txlog", odd)
    page = render_report(odd, title="Orders <prod> & co")
    for section in SECTIONS:
        assert f'id="{section}"' in page
    assert "<b>" not in page and "log &lt;b&gt;&amp;&quot;x" in page
    assert "<title>Orders &lt;prod&gt; &amp; co</title>" in page
    assert "<script" not in page.lower()
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    timeline = _section(page, "timeline")
    assert timeline.count("<rect") == 4
    assert all(f"epoch {e}: committed" in timeline for e in range(4))
    assert "round 0 voided: pre-commit failed" in timeline
    assert "<svg" in _section(page, "latency") and "commit latency" in page
    assert "Nothing pending" in _section(page, "pending")
    assert "pre-commit failed" in _section(page, "voided")
    assert "not checked (pass --pipeline)" in _section(page, "lingering").lower()
    sinks = _section(page, "sinks")
    assert "<code>out</code>" in sinks and f"{ROWS:,}" in sinks


def test_report_of_unfinished_epochs_escapes_and_lists(tmp_path: Path) -> None:
    synthetic_log(tmp_path / "log")
    lingering = {"a": ["txsink.app-1.a.e3.r1.p0.a9"], "b": []}
    page = render_report(tmp_path / "log", lingering=lingering)
    assert "<script>alert" not in page
    assert "pre-commit failed &lt;script&gt;alert(1)&lt;/script&gt;" in page
    pending = _section(page, "pending")
    assert "txsink.app-1.a.e1.r0.p0.a7" in pending and "txsink.app-1.b.e1.r0.p0.a7" in pending
    assert "txsink.app-1.a.e0" not in pending  # committed
    voided = _section(page, "voided")
    assert "aborted by recovery" in voided and "claimed, never decided" in voided
    linger = _section(page, "lingering")
    assert "txsink.app-1.a.e3.r1.p0.a9" in linger and ">none<" in linger
    cards = _section(page, "summary")
    assert re.search(r">1</span><span>decided, not committed", cards)
    assert re.search(r">1</span><span>aborted", cards)
    assert "epochs not restored" in _section(page, "sinks")


def test_charts_cap_at_the_newest_epochs(tmp_path: Path) -> None:
    now = time.time() - 10_000
    epochs = []
    for e in range(CHART_EPOCHS + 100):
        t = now + e * 10
        handle = _handle("a", e, 0, 0, 1)
        epochs.append(
            EpochRecords(
                e,
                {0: {"round": 0, "at": t, "host": "h", "pid": 1}},
                {
                    0: {
                        "kind": "decision",
                        "round": 0,
                        "decided_at": t + 2,
                        "handles": {"a": [handle]},
                        "stats": {"seconds": {"precommit": 1.5}},
                    }
                },
                {"round": 0, "committed_at": t + 3, "not_restored": []},
            )
        )
    snap = LogSnapshot("memory://x", {"app_id": APP, "version": 1}, tuple(epochs), time.time())
    page = render_report(snap)
    note = f"Showing the newest {CHART_EPOCHS} of {CHART_EPOCHS + 100} epochs."
    assert note in _section(page, "timeline") and note in _section(page, "latency")
    assert _section(page, "timeline").count("<rect") == CHART_EPOCHS
    assert _section(page, "latency").count("<circle") == 2 * CHART_EPOCHS
    assert "epoch 99: committed" not in page and "epoch 100: committed" in page


# -- the command --------------------------------------------------------------------------


@pytest.mark.spark
def test_cli_writes_the_report_and_the_csv(
    real_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, csv = tmp_path / "r" / "report.html", tmp_path / "t.csv"
    assert _run_cli("--log", str(real_log / "txlog"), "--out", str(out), "--csv", str(csv)) == 0
    printed = capsys.readouterr().out
    assert f"report written to {out.resolve()}" in printed
    assert "4 epochs: 4 committed, 0 decided and pending, 0 aborted, 0 open" in printed
    assert "1 voided rounds" in printed and "not checked (pass --pipeline)" in printed
    page = out.read_text()
    assert all(f'id="{s}"' in page for s in SECTIONS)
    table = pd.read_csv(csv)
    assert len(table) == len(log_table(real_log / "txlog"))
    assert int(table["rows"].sum()) == ROWS
    assert table["claimed_at"].str.endswith("Z").all()


@pytest.mark.spark
def test_cli_lists_lingering_transactions(
    real_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--pipeline lists each sink's prepared transactions; names a decision holds are
    not lingering. Run against a copy of the output with two staged folders added."""
    app = read_log(real_log / "txlog").app_id
    output = tmp_path / "output"
    shutil.copytree(real_log / "output", output)
    staging = output / "_txsink" / "staging"
    decided = log_table(real_log / "txlog")["txn"].dropna().iloc[0]
    lost = f"txsink.{app}.out.e3.r5.p1.a42"
    for name in (decided, lost):
        (staging / name).mkdir(parents=True, exist_ok=True)
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(
        "from txsink.connectors.files import FilesSink\n\n\n"
        "def sinks():\n"
        f"    return [FilesSink({str(output)!r}, uid='out')]\n"
    )
    out = tmp_path / "report.html"
    argv = ["--log", str(real_log / "txlog"), "--out", str(out), "--pipeline", f"{pipeline}:sinks"]
    assert _run_cli(*argv) == 0
    assert "1 lingering transactions" in capsys.readouterr().out
    linger = _section(out.read_text(), "lingering")
    assert lost in linger and decided not in linger
    # Listing is read-only: both staged folders are still there.
    assert (staging / lost).is_dir() and (staging / decided).is_dir()
    shutil.rmtree(staging / lost)
    shutil.rmtree(staging / decided)
    assert _run_cli(*argv) == 0
    assert "0 lingering transactions" in capsys.readouterr().out
    assert ">none<" in _section(out.read_text(), "lingering")


def test_snapshot_records_round_trip(tmp_path: Path) -> None:
    """read_log keeps each record as written (the report and the tables rely on it)."""
    synthetic_log(tmp_path / "log")
    snap = read_log(tmp_path / "log")
    assert [r.epoch for r in snap.epochs] == [0, 1, 2, 3]
    e3 = snap.epochs[3]
    assert e3.rounds == (0, 1) and e3.voided == (0,) and e3.decision is None
    raw = json.loads(
        (tmp_path / "log" / "epochs" / f"{1:020d}" / "decision-000000.json").read_text()
    )
    assert snap.epochs[1].decision == raw
