"""Errors name the primary cause (issue 34, points 4 and 5): rows by their identity, no
empty fields, a task's error carried to the driver whole, a clean-up's failure never
instead of the failure it followed."""

from __future__ import annotations

import logging
import pickle
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from typing_extensions import override

from tests.memsink import Crasher, MemSink, MemStore, MemTarget
from txsink import Coordinator
from txsink.connectors.postgres.errors import map_error
from txsink.contract import EpochCommit
from txsink.errors import (
    CommitError,
    EpochAbortedError,
    LogError,
    RetryableError,
    TxsinkError,
    WriteError,
)
from txsink.protocol.commit import commit_share
from txsink.protocol.log import TxLog
from txsink.protocol.task import Ack, TaskPlan
from txsink.protocol.taskerror import MARKER, carried, describe, mark
from txsink.rowref import RowNames, RowNaming, RowRef
from txsink.txid import TxnId

BATCH = pa.RecordBatch.from_pydict(
    {
        "id": pa.array([41, 42], pa.int64()),
        "name": ["ann", "bob"],
        "note": ["x" * 500, None],
        "blob": [b"\x00\x01", b"\x02"],
    }
)


# -- rows named by identity --------------------------------------------------------------


def test_a_row_is_named_by_its_key_with_partition_and_offset() -> None:
    ref = RowRef.of(BATCH, 1, ["id"], partition=3, offset=28)
    assert str(ref) == "key id=42 at partition 3, offset 28"
    err = WriteError("t rejected a row: null value", sink_uid="pg", epoch=1, partition=3, row=ref)
    assert str(err) == (
        "[sink_uid=pg, epoch=1, partition=3] t rejected a row: null value "
        "(row key id=42 at partition 3, offset 28)"
    )


def test_a_row_without_key_is_named_by_its_first_columns_cut_short() -> None:
    ref = RowRef.of(BATCH, 0, [], partition=0)
    text = str(ref)
    assert text.startswith("id=41, name='ann', note='xxxx")
    assert text.endswith("… at partition 0, offset 0")
    assert len(ref.named()) <= 200
    # A key column the batch lacks falls back to the first columns too.
    assert str(RowRef.of(BATCH, 1, ["missing"])).startswith("id=42, name='bob', note=None")


def test_redacted_rows_show_column_names_and_a_hash_only() -> None:
    naming = RowNaming(("id", "name"), partition=2, redact=True)
    ref = naming.ref(BATCH, 1, 7)
    assert "42" not in str(ref) and "bob" not in str(ref)
    assert (
        str(ref) == f"key id, name (values redacted, sha256 {ref.digest}) at partition 2, offset 7"
    )
    assert ref.digest is not None and len(ref.digest) == 16
    assert naming.ref(BATCH, 1, 7).digest == ref.digest  # the same row, the same hash
    assert naming.ref(BATCH, 0, 6).digest != ref.digest


def test_row_names_name_a_row_the_server_rejected_later_by_its_offset() -> None:
    names = RowNames(["name"], partition=5)
    names.add(BATCH)
    names.add(BATCH)
    assert str(names.at(3)) == "key name='bob' at partition 5, offset 3"
    assert names.at(None) is None
    assert str(names.at(99)) == "at partition 5, offset 99"  # not kept: the offset only


def test_errors_with_a_row_pickle_whole() -> None:
    err = WriteError("bad", sink_uid="k", row=RowRef.of(BATCH, 0, ["id"], partition=1))
    err.add_note("a note")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is WriteError
    assert str(back) == str(err) == "[sink_uid=k] bad (row key id=41 at partition 1, offset 0)"
    assert back.__notes__ == ["a note"]


def test_no_empty_field_is_printed() -> None:
    err = TxsinkError("it failed", sink_uid="s", phase="", column="")
    assert str(err) == "[sink_uid=s] it failed"
    lost = psycopg.OperationalError("connection refused")  # no session: no SQLSTATE
    mapped = map_error(
        lost, TxnId("app", "pg", 1, 0, 2, 0), sink_uid="pg", table="t", phase="begin"
    )
    assert isinstance(mapped, RetryableError)
    assert "SQLSTATE" not in str(mapped)
    assert str(mapped).startswith(
        "[sink_uid=pg, epoch=1, partition=2, phase=begin, connector=postgres] transient "
        "PostgreSQL error: connection refused. Spark retries the task"
    )


# -- a task's error carried to the driver ----------------------------------------------


class _PythonFailure(Exception):
    """What PySpark raises for a failed Python task: the traceback as a parameter."""

    def __init__(self, trace: str) -> None:
        super().__init__()  # repr: _PythonFailure(), as PySpark's PythonException()
        self.trace = trace

    def getCondition(self) -> str:
        return "PYTHON_EXCEPTION"

    def getMessageParameters(self) -> dict[str, str]:
        return {"msg": "An exception was thrown from the Python worker", "traceback": self.trace}


def test_the_rounds_read_a_tasks_error_past_its_notes() -> None:
    """The note that carries a task's error (and a clean-up's) follows the exception's
    own line in the traceback: the outage rounds still find the task's error type there,
    so a transient one is ridden out (txsink.protocol.rounds)."""
    from txsink.protocol.rounds import task_error_line, transient

    err = mark(RetryableError("connection lost", phase="write"), partition=2)
    trace = "".join(traceback.format_exception(err))
    trace += "(then voiding the round failed too: RetryableError: down)\n"
    failure = _PythonFailure(trace)
    assert task_error_line(failure) == (
        "txsink.errors.RetryableError: [partition=2, phase=write] connection lost"
    )
    assert transient(failure)


class _Java:
    def __init__(self, text: str, cause: _Java | None = None) -> None:
        self.text, self.cause = text, cause

    def toString(self) -> str:
        return self.text

    def getMessage(self) -> str:
        return self.text

    def getCause(self) -> _Java | None:
        return self.cause


class _Py4JFailure(Exception):
    """A ``Py4JJavaError``: says only which call failed; the cause is in the JVM."""

    def __init__(self, java: _Java) -> None:
        super().__init__("An error occurred while calling o267.collectToPython.\n")
        self.java_exception = java


def _traceback_of(err: BaseException) -> str:
    try:
        raise err
    except BaseException as raised:
        return "".join(traceback.format_exception(raised))


def test_a_retryable_error_raised_in_a_task_reaches_the_driver_as_itself() -> None:
    raised = RetryableError("Kafka shard 1: reading the marker failed", sink_uid="k", shard=1)
    trace = _traceback_of(mark(raised, partition=0, phase="commit"))
    found = carried(_PythonFailure(trace))
    assert type(found) is RetryableError
    assert str(found) == (
        "[sink_uid=k, partition=0, shard=1, phase=commit] Kafka shard 1: reading the marker failed"
    )
    assert describe(_PythonFailure(trace)) == f"RetryableError: {found}"


def test_a_raw_error_in_a_task_is_named_by_its_type_through_a_py4j_failure() -> None:
    trace = _traceback_of(mark(ConnectionResetError("peer reset"), partition=2))
    java = _Java(
        "org.apache.spark.SparkException: Job aborted",
        _Java(f"org.apache.spark.api.python.PythonException: {trace}"),
    )
    found = carried(_Py4JFailure(java))
    assert type(found) is TxsinkError
    assert str(found) == "[partition=2] ConnectionResetError: peer reset"


def test_a_marker_in_a_servers_text_cannot_import_or_unpickle_anything() -> None:
    spoof = MARKER + '{"type": "os:system", "message": "rm", "context": {"phase": "x"}}'
    found = carried(_PythonFailure(f"Traceback...\nValueError: bad value {spoof}\n"))
    assert type(found) is TxsinkError
    assert str(found) == "[phase=x] system: rm"


def test_a_failure_without_a_marker_is_described_by_its_own_words() -> None:
    trace = "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero\n"
    assert carried(_PythonFailure(trace)) is None
    assert describe(_PythonFailure(trace)) == "ZeroDivisionError: division by zero"
    java = _Java("org.apache.spark.SparkException: Job aborted", _Java("java.io.EOFException"))
    assert describe(_Py4JFailure(java)) == "java.io.EOFException"


class _CommitInTasks(MemSink):
    """A sink that commits its handles as tasks (as Kafka's replay and WAL modes do)."""

    def __init__(self, failure: Exception) -> None:
        super().__init__("s", MemTarget(), Crasher())
        self.failure = failure

    @override
    def commit_epoch(self, request: EpochCommit[Any]) -> None:
        request.tasks.run(_Raise(self.failure), [0, 1])


class _Raise:
    def __init__(self, failure: Exception) -> None:
        self.failure = failure

    def __call__(self, item: int) -> None:
        if item == 1:
            raise self.failure


@pytest.mark.spark
def test_a_commit_task_failing_raw_is_a_commit_error_with_its_type(spark: Any) -> None:
    from txsink.spark.jobs import SparkTaskRunner

    sink = _CommitInTasks(ConnectionResetError("peer reset"))
    handle = sink.prepare(sink.begin(TxnId("app", "s", 4, 0, 0, 0), BATCH.schema))
    with pytest.raises(CommitError) as caught:
        commit_share(
            sink, 4, [handle], data=None, on_committed=lambda hs: None, tasks=SparkTaskRunner(spark)
        )
    # An item of a commit spread over tasks is no partition of the epoch: not told as one.
    assert str(caught.value) == (
        "[sink_uid=s, epoch=4, phase=commit, connector=memory] commit of epoch 4 "
        "(1 handle(s)) failed in a task: ConnectionResetError: peer reset; the decision stands "
        "and recovery retries it on the next run"
    )
    assert "PythonException" not in str(caught.value)


@pytest.mark.spark
def test_a_commit_task_failing_retryable_keeps_its_type_and_shard(spark: Any) -> None:
    from txsink.spark.jobs import SparkTaskRunner

    failure = RetryableError("Kafka shard 1: no leader for the marker topic", shard=1)
    sink = _CommitInTasks(failure)
    handle = sink.prepare(sink.begin(TxnId("app", "s", 4, 0, 0, 0), BATCH.schema))
    with pytest.raises(RetryableError) as caught:
        commit_share(
            sink, 4, [handle], data=None, on_committed=lambda hs: None, tasks=SparkTaskRunner(spark)
        )
    assert str(caught.value) == (
        "[sink_uid=s, epoch=4, shard=1, phase=commit, connector=memory] "
        "Kafka shard 1: no leader for the marker topic"
    )


# -- a clean-up's failure never replaces the failure it followed ---------------------------


class _TargetDown(MemSink):
    """A sink whose target went down: listing its prepared transactions fails as well."""

    @override
    def list_prepared(self, app_id: str) -> Iterator[Any]:
        raise RetryableError("consuming input failed", phase="recover", sink_uid=self.uid)


def test_the_precommits_failure_is_raised_not_the_aborts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = _TargetDown("pg", MemTarget(), Crasher())
    coordinator = Coordinator([sink], log=tmp_path / "log", app_id="app", outage_s=0)
    coordinator._recover_if_needed = lambda *a, **k: False  # type: ignore[method-assign]
    primary = RetryableError("Connection refused", sink_uid="pg", phase="begin", partition=0)

    def precommit(plan: TaskPlan) -> list[Ack]:
        raise primary

    with caplog.at_level(logging.WARNING, "txsink"), pytest.raises(EpochAbortedError) as caught:
        coordinator.run_epoch(0, precommit, app_id="app")
    assert str(caught.value) == (
        "[sink_uid=pg, epoch=0, partition=0, phase=begin] epoch 0 aborted, nothing of it is "
        "visible: Connection refused"
    )
    assert caught.value.causes == [primary]
    # The aborts are best effort: their failure is a WARNING beside the cause, not instead.
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("consuming input failed" in w for w in warned), warned


class _LogDown(MemStore):
    """A log store that fails once the epoch's round is claimed: its void fails too."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    @override
    def create(self, key: str, data: bytes) -> bool:
        if self.down:
            raise LogError("the log's store is down")
        return super().create(key, data)


def test_a_failed_void_is_a_note_of_the_error_raised(tmp_path: Path) -> None:
    """The void of the failed round fails (the log's store went down with the target):
    the pre-commit's failure is raised, the void's failure a note on it and on the epoch's
    abort that is raised."""
    store = _LogDown()
    coordinator = Coordinator(
        [MemSink("pg", MemTarget(), Crasher())], log=TxLog(store), app_id="app", outage_s=0
    )
    coordinator._recover_if_needed = lambda *a, **k: False  # type: ignore[method-assign]
    primary = RetryableError("Connection refused", sink_uid="pg", phase="begin", partition=0)

    def precommit(plan: TaskPlan) -> list[Ack]:
        store.down = True
        raise primary

    with pytest.raises(EpochAbortedError) as caught:
        coordinator.run_epoch(0, precommit, app_id="app")
    assert caught.value.causes == [primary]
    notes = [n for n in getattr(caught.value, "__notes__", ()) if "failed too" in n]
    assert notes == ["(then voiding the round failed too: LogError: the log's store is down)"]


# -- raw client exceptions wrapped and classified by code --------------------------------


def test_kafka_client_errors_are_wrapped_and_classified_by_code() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from txsink.connectors.kafka.clients.errors import client_calls
    from txsink.connectors.kafka.clients.settings import KafkaSettings

    settings = KafkaSettings("127.0.0.1:9092", "k", "txsink", "markers", 2, 10.0)

    def raised(code: int, text: str) -> TxsinkError:
        calls = client_calls(settings, "reading the marker topic", phase="commit", shard=1)
        with pytest.raises(TxsinkError) as caught, calls:
            raise KafkaException(KafkaError(code, text))
        return caught.value

    leaderless = raised(KafkaError._NOENT, "No leaders found")
    assert type(leaderless) is RetryableError  # not retriable() in librdkafka: by code
    assert str(leaderless).startswith(
        "[sink_uid=k, shard=1, phase=commit, connector=kafka] Kafka shard 1: reading the "
        "marker topic failed: No leaders found (_NOENT); transient"
    )
    assert type(raised(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied")).__name__ == (
        "ConfigurationError"
    )
    assert type(raised(KafkaError.INVALID_PRODUCER_EPOCH, "fenced")).__name__ == "FencedError"
    assert type(raised(KafkaError.INVALID_CONFIG, "bad")) is CommitError
