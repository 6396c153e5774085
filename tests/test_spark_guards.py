"""Guards in txsink._spark, with stand-ins for the JVM objects.

Spark 4 itself refuses async progress tracking and continuous triggers with
foreachBatch, so a real query cannot reach txsink in those modes today; the
guard is for Spark versions or forks that allow it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from txsink import _spark
from txsink.errors import UnsupportedQueryError


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
        _spark.check_query_mode(df, "q1")


def test_accepts_micro_batch() -> None:
    _spark.check_query_mode(_df(_Query("q1", "MicroBatchExecution")), "q1")
