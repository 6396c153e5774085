"""Checks before the stream starts (``Coordinator.check``, ``txsink.check``, ``txsink
check``) and failures logged once at ERROR before Spark wraps them; no servers.

The servers' cases (a missing table or schema, an unreachable server) are in
``integration/test_precheck.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest
from typing_extensions import override

import txsink
from tests.memsink import Crasher, MemSink, MemTarget
from tests.streaming import SCHEMA, prepare_input, start_query
from txsink import Coordinator
from txsink.cli import main
from txsink.connectors.files import FilesSink
from txsink.errors import (
    CheckpointMismatchError,
    ConfigurationError,
    LogError,
    TxsinkError,
)
from txsink.protocol.log import open_log
from txsink.sink import Partitioning
from txsink.spark.checks import check_sinks


class CheckSink(MemSink):
    """A sink whose start-up check records its app id and raises ``fail``, if given."""

    connector: ClassVar[str] = "memory"

    def __init__(
        self, uid: str, fail: BaseException | None = None, part: Partitioning | None = None
    ) -> None:
        super().__init__(uid, MemTarget(), Crasher())
        self.fail = fail
        self.part = part
        self.apps: list[str] = []

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        self.apps.append(app_id)
        if self.fail is not None:
            raise self.fail

    @override
    def required_partitioning(self) -> Partitioning | None:
        return self.part


class Records(logging.Handler):
    """The records of the ``txsink`` logger itself (whatever handlers others add to it)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self, text: str) -> list[str]:
        return [
            r.getMessage()
            for r in self.records
            if r.levelno == logging.ERROR and text in r.getMessage()
        ]


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("txsink")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _stream(spark: Any, tmp_path: Path) -> Any:
    (tmp_path / "input").mkdir(exist_ok=True)
    return spark.readStream.schema(SCHEMA).parquet(str(tmp_path / "input"))


def _checkpoint(path: Path, query_id: str, *, offsets: int | None, commits: int | None) -> str:
    """A Spark checkpoint folder as Spark leaves it: ``metadata``, ``offsets/``, ``commits/``."""
    path.mkdir(parents=True)
    (path / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    for folder, last in (("offsets", offsets), ("commits", commits)):
        (path / folder).mkdir()
        for batch in range(0 if last is None else last + 1):
            (path / folder / str(batch)).write_text("v1\n")
    return str(path)


def _committed_log(path: Path, app: str, epochs: int) -> None:
    log = open_log(path)
    log.bind_app(app)
    for epoch in range(epochs):
        round_ = log.claim_round(epoch)
        log.decide(epoch, round_, {})
        log.mark_committed(epoch, round_)


# -- Coordinator.check ---------------------------------------------------------------------


def test_check_passes_and_binds_nothing(spark: Any, tmp_path: Path) -> None:
    sink = CheckSink("a")
    coordinator = Coordinator(
        [sink, FilesSink(str(tmp_path / "out"), uid="f")], log=tmp_path / "log"
    )
    results = coordinator.check(_stream(spark, tmp_path))
    assert [r.what for r in results] == ["schema", "app", "log", "partitioning", "sink a", "sink f"]
    assert all(r.ok for r in results)
    assert results[0].detail == "id int64, key string, amount double, payload string"
    assert sink.apps == ["new-query"]  # empty log, no checkpoint: a new query
    assert not (tmp_path / "log").exists()  # nothing bound, nothing written to the log


def test_check_reads_the_app_from_the_checkpoint(spark: Any, tmp_path: Path) -> None:
    _committed_log(tmp_path / "log", "q-1", epochs=3)
    cp = _checkpoint(tmp_path / "cp", "q-1", offsets=2, commits=2)
    sink = CheckSink("a")
    results = Coordinator([sink], log=tmp_path / "log").check(
        _stream(spark, tmp_path), checkpoint=cp
    )
    assert sink.apps == ["q-1"]
    assert results[1].detail.startswith("q-1 (from ")
    assert "app q-1, last committed epoch 2" in results[2].detail


def test_check_without_checkpoint_checks_sinks_as_the_logs_app(spark: Any, tmp_path: Path) -> None:
    _committed_log(tmp_path / "log", "q-1", epochs=1)
    sink = CheckSink("a")
    Coordinator([sink], log=tmp_path / "log").check(_stream(spark, tmp_path))
    assert sink.apps == ["q-1"]


def test_check_refuses_a_new_checkpoint_on_a_bound_log(spark: Any, tmp_path: Path) -> None:
    _committed_log(tmp_path / "log", "q-1", epochs=1)
    coordinator = Coordinator([CheckSink("a")], log=tmp_path / "log")
    with pytest.raises(CheckpointMismatchError, match="belongs to app 'q-1', but the checkpoint"):
        coordinator.check(_stream(spark, tmp_path), checkpoint=tmp_path / "new-cp")
    with pytest.raises(CheckpointMismatchError, match="belongs to app 'q-1', but this query"):
        other = _checkpoint(tmp_path / "other", "q-2", offsets=0, commits=0)
        coordinator.check(_stream(spark, tmp_path), checkpoint=other)


def test_check_refuses_a_checkpoint_behind_the_log(spark: Any, tmp_path: Path) -> None:
    _committed_log(tmp_path / "log", "q-1", epochs=4)  # last committed: 3
    cp = _checkpoint(tmp_path / "cp", "q-1", offsets=1, commits=1)  # restarts at 2
    with pytest.raises(CheckpointMismatchError, match="epoch 2 was asked for") as caught:
        Coordinator([CheckSink("a")], log=tmp_path / "log").check(
            _stream(spark, tmp_path), checkpoint=cp
        )
    assert caught.value.phase == "check"


def test_check_of_a_static_frame_needs_an_app_id_on_an_empty_log(
    spark: Any, tmp_path: Path
) -> None:
    df = spark.createDataFrame([], SCHEMA)
    with pytest.raises(ConfigurationError, match="is empty and no app_id was given"):
        Coordinator([CheckSink("a")], log=tmp_path / "log").check(df)
    Coordinator([CheckSink("a")], log=tmp_path / "log", app_id="nightly").check(df)


def test_check_refuses_a_log_that_cannot_be_written(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(LogError, match="is not a folder"):
        Coordinator([CheckSink("a")], log=tmp_path / "file" / "log").check(_stream(spark, tmp_path))


def test_check_refuses_sinks_that_disagree_on_partitioning(spark: Any, tmp_path: Path) -> None:
    sinks = [
        CheckSink("a", part=Partitioning(("id",))),
        CheckSink("b", part=Partitioning(("key",))),
    ]
    with pytest.raises(ConfigurationError, match="need different partitioning"):
        Coordinator(sinks, log=tmp_path / "log").check(_stream(spark, tmp_path))
    missing = [CheckSink("a", part=Partitioning(("nope",)))]
    with pytest.raises(ConfigurationError, match="has no column 'nope'") as caught:
        Coordinator(missing, log=tmp_path / "log").check(_stream(spark, tmp_path))
    assert caught.value.column == "nope"


def test_a_sink_check_failure_names_sink_phase_and_fix(spark: Any, tmp_path: Path) -> None:
    bad = CheckSink("a", fail=ConfigurationError("table t does not exist: create it"))
    with pytest.raises(ConfigurationError) as caught:
        Coordinator([bad], log=tmp_path / "log").check(_stream(spark, tmp_path))
    assert str(caught.value) == (
        "[sink_uid=a, phase=check, connector=memory] table t does not exist: create it"
    )


def test_a_raw_exception_from_a_sink_check_becomes_a_txsink_error(
    spark: Any, tmp_path: Path
) -> None:
    raw = CheckSink("a", fail=OSError(111, "Connection refused"))
    with pytest.raises(ConfigurationError) as caught:
        Coordinator([raw], log=tmp_path / "log").check(_stream(spark, tmp_path))
    assert caught.value.context == {"sink_uid": "a", "phase": "check", "connector": "memory"}
    assert "ConnectionRefusedError: [Errno 111] Connection refused" in caught.value.message
    assert isinstance(caught.value.__cause__, OSError)


def test_every_failed_check_is_reported(spark: Any, tmp_path: Path) -> None:
    sinks = [
        CheckSink("a", fail=ConfigurationError("first: fix a")),
        CheckSink("b"),
        CheckSink("c", fail=ConfigurationError("second: fix c")),
    ]
    with pytest.raises(ConfigurationError, match="first: fix a") as caught:
        Coordinator(sinks, log=tmp_path / "log").check(_stream(spark, tmp_path))
    assert caught.value.__notes__ == [
        "also failed: [sink_uid=c, phase=check, connector=memory] second: fix c"
    ]
    assert sinks[1].apps == ["new-query"]  # checked although an earlier sink failed


# -- txsink.check and the drop-in sink ------------------------------------------------------


def test_txsink_check_of_a_drop_in_sink(spark: Any, tmp_path: Path) -> None:
    sink = FilesSink(str(tmp_path / "out"), uid="f", log=str(tmp_path / "log"))
    assert all(r.ok for r in txsink.check(_stream(spark, tmp_path), sink))
    assert txsink.check(_stream(spark, tmp_path), Coordinator([CheckSink("a")], log=tmp_path))


def test_drop_in_sink_without_log_is_a_configuration_error(spark: Any, tmp_path: Path) -> None:
    sink = FilesSink(str(tmp_path / "out"), uid="orders")
    with pytest.raises(ConfigurationError) as caught:
        txsink.check(_stream(spark, tmp_path), sink)
    assert str(caught.value) == (
        "[sink_uid=orders, phase=check, connector=files] FilesSink(uid='orders') was used as "
        "foreachBatch(sink) without log=...: pass log='<path or URL of the txsink log>' or "
        "wrap it in txsink.Coordinator([sink], log=...)"
    )
    assert not (tmp_path / "out").exists()  # refused before any sink check


# -- logged once at ERROR, before Spark wraps it -------------------------------------------


def test_first_batch_failure_is_logged_once_before_spark_wraps_it(
    spark: Any, tmp_path: Path, records: Records
) -> None:
    prepare_input(tmp_path, rows=10, files=1)
    bad = CheckSink("a", fail=ConfigurationError("table t does not exist: create it"))
    query = start_query(spark, tmp_path, Coordinator([bad], log=tmp_path / "log"))
    with pytest.raises(Exception, match="table t does not exist") as caught:
        query.awaitTermination()
    assert not isinstance(caught.value, TxsinkError)  # Spark's StreamingQueryException
    assert records.errors("table t does not exist") == [
        "[uid=a epoch=0] ConfigurationError: [sink_uid=a, phase=check, connector=memory] "
        "table t does not exist: create it"
    ]


def test_drop_in_sink_without_log_fails_the_first_batch_logged_once(
    spark: Any, tmp_path: Path, records: Records
) -> None:
    prepare_input(tmp_path, rows=10, files=1)
    query = start_query(spark, tmp_path, FilesSink(str(tmp_path / "out"), uid="orders"))
    with pytest.raises(Exception, match="ConfigurationError"):
        query.awaitTermination()
    assert len(records.errors("without log=")) == 1
    assert records.errors("without log=")[0].startswith(
        "[uid=orders epoch=0] ConfigurationError: [sink_uid=orders, phase=check, "
        "connector=files] FilesSink(uid='orders') was used as foreachBatch(sink) without log="
    )


def test_write_failure_is_logged_once(spark: Any, tmp_path: Path, records: Records) -> None:
    bad = CheckSink("a", fail=ConfigurationError("no such table: create it"))
    coordinator = Coordinator([bad], log=tmp_path / "log", app_id="nightly")
    with pytest.raises(ConfigurationError):
        coordinator.write(spark.createDataFrame([(1,)], "id long"), epoch=0)
    assert records.errors("no such table") == [
        "[uid=a epoch=0] ConfigurationError: [sink_uid=a, phase=check, connector=memory] "
        "no such table: create it"
    ]


def test_check_itself_logs_nothing(spark: Any, tmp_path: Path, records: Records) -> None:
    """The caller of check() gets the error; a log line would print the message twice."""
    bad = CheckSink("a", fail=ConfigurationError("no such table: create it"))
    with pytest.raises(ConfigurationError):
        Coordinator([bad], log=tmp_path / "log").check(_stream(spark, tmp_path))
    assert records.errors("no such table") == []


# -- txsink check ---------------------------------------------------------------------------

PIPELINE = """
from pyspark.sql import SparkSession

from txsink import Coordinator
from txsink.connectors.files import FilesSink

def coordinator():
    return Coordinator([FilesSink({out!r}, uid="orders", format="csv")], log={log!r})

def dropin():
    return FilesSink({out!r}, uid="orders")

def with_frame():
    spark = SparkSession.builder.getOrCreate()
    return coordinator(), spark.readStream.schema("id long, tags array<string>").parquet({inp!r})
"""


@pytest.fixture
def pipeline(tmp_path: Path) -> str:
    (tmp_path / "input").mkdir()
    path = tmp_path / "job.py"
    path.write_text(
        PIPELINE.format(
            out=str(tmp_path / "out"), log=str(tmp_path / "log"), inp=str(tmp_path / "input")
        )
    )
    return str(path)


def test_cli_check_passes(spark: Any, pipeline: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--pipeline", f"{pipeline}:coordinator", "--schema", SCHEMA]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == "ok    schema: id int64, key string, amount double, payload string"
    assert "ok    sink orders: FilesSink(uid='orders') as app 'new-query'" in lines
    assert lines[-1] == "txsink check: all 5 checks passed"


def test_cli_check_one_line_per_failed_check(
    spark: Any, pipeline: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--pipeline", f"{pipeline}:with_frame"]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "txsink check: [sink_uid=orders, phase=check, connector=files, column=tags] column "
        "'tags' has type list<element: string>, which CSV cannot hold: use format='parquet' or "
        "'jsonl', or convert the column (e.g. to_json) before the sink"
    ]
    assert out.splitlines()[-1] == "txsink check: 1 of 5 checks failed"


def test_cli_check_drop_in_without_log(
    spark: Any, pipeline: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--pipeline", f"{pipeline}:dropin", "--schema", SCHEMA]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith(
        "txsink check: [sink_uid=orders, phase=check, connector=files] FilesSink(uid='orders') "
        "was used as foreachBatch(sink) without log=...: pass log="
    )


def test_cli_check_needs_a_schema(
    spark: Any, pipeline: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--pipeline", f"{pipeline}:coordinator"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"txsink check: --pipeline '{pipeline}:coordinator' returned no DataFrame: pass "
        "--schema '<Spark DDL of the DataFrame the query writes>', or return (coordinator, df)"
    ]
    assert main(["check", "--pipeline", f"{pipeline}:coordinator", "--schema", "id lng"]) == 1
    assert "is not a Spark DDL schema" in capsys.readouterr().err


class RememberingSink(CheckSink):
    """A sink whose target records epochs of app ``a`` up to 4 (a marker, a progress row)."""

    @override
    def recorded_epoch(self, app_id: str) -> int | None:
        return 4 if app_id == "a" else None


def test_a_fresh_log_is_refused_where_the_target_remembers_the_app(
    spark: Any, tmp_path: Path
) -> None:
    """A new log reusing app id ``a`` would number epochs from 0 again, and a sink that
    skips what its target records would drop them without a word: refused at the check,
    before any row; another app id, or the app's own log, starts."""
    df = spark.createDataFrame([(1, "k", 1.0, "p")], SCHEMA)
    sink = RememberingSink("mem")
    with pytest.raises(ConfigurationError) as caught:
        Coordinator([sink], log=str(tmp_path / "new-log"), app_id="a").write(df, epoch=0)
    text = str(caught.value)
    assert "sink_uid=mem" in text and "phase=check" in text, text
    assert "records epochs up to 4 of app 'a'" in text and "new app_id" in text, text
    assert sink.target.visible() == [] and not sink.target.prepared
    schema = pa.schema([("id", pa.int64())])
    check_sinks([sink], schema, "b", None, log=open_log(tmp_path / "other"))
    _committed_log(tmp_path / "own-log", "a", 5)
    check_sinks([sink], schema, "a", None, log=open_log(tmp_path / "own-log"))


# -- max_tasks: refused when the coordinator is built ----------------------------------


@pytest.mark.parametrize("bad", [0, -1, True, "all", 2.0])
def test_max_tasks_must_be_a_positive_int_or_slots(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="max_tasks"):
        Coordinator([CheckSink("a")], log=str(tmp_path / "log"), max_tasks=bad)


def test_max_tasks_refused_for_a_fixed_task_count(tmp_path: Path) -> None:
    sink = CheckSink("shards", part=Partitioning(("k",), num_partitions=4))
    with pytest.raises(ConfigurationError, match="exactly 4 tasks") as err:
        Coordinator([CheckSink("a"), sink], log=str(tmp_path / "log"), max_tasks="slots")
    assert err.value.sink_uid == "shards"
    # a key without a fixed count keeps its rows together through a coalesce: allowed
    Coordinator(
        [CheckSink("keyed", part=Partitioning(("k",)))], log=str(tmp_path / "l"), max_tasks=2
    )


def test_max_tasks_refused_for_a_sink_that_commits_in_its_tasks(tmp_path: Path) -> None:
    from tests.test_single_pass_core import InTaskSink

    with pytest.raises(ConfigurationError, match="barrier stage") as err:
        Coordinator([InTaskSink("in-task", MemTarget(), Crasher())], log=str(tmp_path / "l"),
                    max_tasks=2)  # fmt: skip
    assert err.value.sink_uid == "in-task"


def test_auto_max_tasks_coalesces_only_when_every_sink_prefers_fewer_tasks(
    tmp_path: Path,
) -> None:
    class Table(CheckSink):
        @property
        @override
        def fewer_tasks(self) -> bool:
            return True

    def resolved(*sinks: Any) -> Any:
        return Coordinator(list(sinks), log=str(tmp_path / "log")).max_tasks

    assert resolved(Table("t1"), Table("t2")) == "slots"
    assert resolved(Table("t1"), CheckSink("other")) is None
    assert resolved(CheckSink("other")) is None
    # a table next to a sink with a fixed task count: auto leaves the epoch alone
    assert resolved(Table("t1"), Table("t2", part=Partitioning(("k",), 3))) is None
