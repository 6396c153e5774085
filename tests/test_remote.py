"""A coordinator pickled to another process (Spark Connect's foreachBatch), without Spark."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from txsink import Coordinator
from txsink.connectors.files import FilesSink
from txsink.errors import ConfigurationError
from txsink.protocol.log import open_log
from txsink.spark.query import is_connect, streaming_query_id


class _ConnectFrame:
    """Stands for a Connect DataFrame: only its class's module is looked at."""


_ConnectFrame.__module__ = "pyspark.sql.connect.dataframe"


def test_the_log_travels_as_its_location_and_is_opened_on_arrival(tmp_path: Path) -> None:
    coordinator = Coordinator(FilesSink(tmp_path / "out", uid="o"), log=str(tmp_path / "log"))
    coordinator.bind("app-1")
    coordinator._needs_recovery = False
    shipped: dict[str, Any] = coordinator.__getstate__()
    assert shipped["log"] is None and shipped["_recovery"] is None
    back = pickle.loads(pickle.dumps(coordinator))
    assert back.log is not coordinator.log
    assert back.log.location == coordinator.log.location
    assert back._recovery.log is back.log
    # What the client's process learnt stays there: the arrival binds and recovers again.
    assert back._bound_app is None and back._needs_recovery


def test_a_log_that_refuses_pickling_does_not_travel(tmp_path: Path) -> None:
    class NoPickle:
        def __reduce__(self) -> Any:
            raise TypeError("a store with credentials")

    coordinator = Coordinator(FilesSink(tmp_path / "out", uid="o"), log=str(tmp_path / "log"))
    coordinator.log.store = NoPickle()  # type: ignore[assignment]
    back = pickle.loads(pickle.dumps(coordinator))
    assert back.log.location == str(tmp_path / "log")


def test_a_log_given_as_a_store_travels_as_it_is(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log")
    coordinator = Coordinator(FilesSink(tmp_path / "out", uid="o"), log=log)
    back = pickle.loads(pickle.dumps(coordinator))
    assert back.log.location == log.location


def test_a_drop_in_sink_keeps_its_log_location_when_pickled(tmp_path: Path) -> None:
    sink = FilesSink(tmp_path / "out", uid="o", log=str(tmp_path / "log"))
    back = pickle.loads(pickle.dumps(sink))
    assert back.coordinator().log.location == str(tmp_path / "log")


def test_connect_frames_have_no_query_id() -> None:
    frame: Any = _ConnectFrame()
    assert is_connect(frame)
    assert streaming_query_id(frame) is None


def test_under_connect_without_app_id_the_error_says_so(tmp_path: Path) -> None:
    coordinator = Coordinator(FilesSink(tmp_path / "out", uid="o"), log=str(tmp_path / "log"))
    with pytest.raises(ConfigurationError, match=r"under Spark Connect.*pass app_id="):
        coordinator(_ConnectFrame(), 0)  # type: ignore[arg-type]
    assert not (tmp_path / "log").exists()  # refused before anything is written
