"""Guards in txsink.spark.jobs, with stand-ins for the JVM objects.

Spark 4 itself refuses async progress tracking and continuous triggers with
foreachBatch, so a real query cannot reach txsink in those modes today; the
guard is for Spark versions or forks that allow it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from txsink.errors import UnsupportedQueryError
from txsink.spark import jobs as _spark
from txsink.spark import query as _query
from txsink.spark.versions import arrow_byte_cap_setting


@dataclass
class _Named:
    value: str

    def toString(self) -> str:
        return self.value

    def getSimpleName(self) -> str:
        return self.value


@dataclass
class _Query:
    qid: str
    execution: str

    def id(self) -> _Named:
        return _Named(self.qid)

    def streamingQuery(self) -> Any:
        execution = self.execution

        class _Exec:
            def getClass(self) -> _Named:
                return _Named(execution)

        return _Exec()


def _df(*queries: _Query) -> Any:
    class Streams:
        def active(self) -> list[_Query]:
            return list(queries)

    class JSession:
        def streams(self) -> Streams:
            return Streams()

    class Session:
        _jsparkSession = JSession()

    class DF:
        sparkSession = Session()

    return DF()


@pytest.mark.parametrize(
    ("execution", "what"),
    [
        ("AsyncProgressTrackingMicroBatchExecution", "async progress tracking"),
        ("ContinuousExecution", "a continuous trigger"),
    ],
)
def test_refuses_modes_that_break_replay(execution: str, what: str) -> None:
    df = _df(_Query("other", "MicroBatchExecution"), _Query("q1", execution))
    with pytest.raises(UnsupportedQueryError, match=what):
        _query.check_query_mode(df, "q1")


def test_accepts_micro_batch() -> None:
    _query.check_query_mode(_df(_Query("q1", "MicroBatchExecution")), "q1")


class _Conf:
    def __init__(self, **values: str) -> None:
        self.values = dict(values)
        self.seen: list[str | None] = []

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        del self.values[key]


@pytest.mark.spark_line("4")
@pytest.mark.matrix("byte_cap")
@pytest.mark.parametrize("user", [None, "128MB"])
def test_arrow_byte_cap_is_lifted_for_txsinks_job_only(user: str | None) -> None:
    """Spark 4 measures the Arrow batch after every row while the byte cap holds: lifted
    (Int.MaxValue: Spark skips the check) during txsink's job, restored after; a value the
    user set is kept. (Spark 3.5 has no byte cap: tests/test_spark_versions.py.)"""
    cap = arrow_byte_cap_setting()
    assert cap is not None
    conf = _Conf(**({cap: user} if user else {}))

    class Session:
        pass

    session = Session()
    session.conf = conf  # type: ignore[attr-defined]
    with _spark.arrow_batches_cut_by_rows(session):
        during = conf.get(cap)
    assert during == (user or "2147483647")
    assert conf.get(cap) == user
    with pytest.raises(RuntimeError), _spark.arrow_batches_cut_by_rows(session):
        raise RuntimeError("the job failed")
    assert conf.get(cap) == user
