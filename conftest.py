"""Fixtures for tests/ and integration/: one local SparkSession per test session (~7 s to start),
and a session that keeps to itself on a shared machine (:mod:`tests.sharedmachine`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import matrixrun
from tests.sharedmachine import SessionArchive, SessionTemp

_TEMP = SessionTemp()
_ARCHIVE = pytest.StashKey[SessionArchive]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="also run the slow tests (one subprocess run per crash point)",
    )
    parser.addoption(
        "--spark-line",
        default=os.environ.get("TXSINK_SPARK_LINE") or None,
        metavar="X.Y",
        help="the Spark line this run is for (default: $TXSINK_SPARK_LINE): the run stops at "
        "once if the installed PySpark is another one (a matrix cell in the wrong venv)",
    )
    matrixrun.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """The session's own temporary folder, and the Spark archive's policy for its children
    (nothing is built here: a collection never builds)."""
    _TEMP.install()
    config.stash[_ARCHIVE] = SessionArchive()
    results = config.getoption("--matrix-json")
    if results:
        config.pluginmanager.register(matrixrun.MatrixRecorder(Path(results)), "txsink-matrix")
    wanted = config.getoption("--spark-line")
    if wanted:
        from txsink.spark.versions import spark_line

        if spark_line() != wanted:
            raise pytest.UsageError(
                f"--spark-line / TXSINK_SPARK_LINE is {wanted}, but this Python ({sys.executable}) "
                f"has PySpark {spark_line()}: run it with .venv-spark-{wanted}/bin/python "
                f"(./dev spark-line {wanted} makes it)"
            )


def pytest_unconfigure(config: pytest.Config) -> None:
    _TEMP.remove()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (
            "spark" in getattr(item, "fixturenames", ())
            and item.get_closest_marker("spark") is None
        ):
            item.add_marker(pytest.mark.spark)
    _skip_other_lines(items)
    matrixrun.select(config, items)
    if config.getoption("--run-slow") or os.environ.get("TXSINK_SLOW") == "1":
        return
    # A matrix run (--matrix) runs its slow tests too: each stands for a feature on a line.
    matrix = config.getoption("--matrix")
    skip = pytest.mark.skip(reason="slow: run with --run-slow or TXSINK_SLOW=1")
    for item in items:
        if "slow" in item.keywords and not (matrix and item.get_closest_marker("matrix")):
            item.add_marker(skip)


def _skip_other_lines(items: list[pytest.Item]) -> None:
    """A test marked ``spark_line("3.5")`` pins that line's behaviour (``"4"``: every 4.x
    line): skipped where another line is installed (each line's venv runs its own:
    docs/testing.md)."""
    marked = [(item, m) for item in items if (m := item.get_closest_marker("spark_line"))]
    if not marked:
        return
    from txsink.spark.versions import spark_line

    installed = spark_line()
    for item, mark in marked:
        lines = {str(a) for a in mark.args}
        if not any(installed == line or installed.startswith(f"{line}.") for line in lines):
            reason = f"pins Spark {'/'.join(sorted(lines))}; PySpark {installed} is installed"
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the first test that starts Spark (marked ``spark``; a skipped test never gets
    here): build the class-data-sharing archive (~45 s once per machine), so every driver
    the tests start afterwards starts ~5 s faster."""
    archive = item.config.stash.get(_ARCHIVE, None)
    if archive is not None and item.get_closest_marker("spark") is not None:
        archive.ensure()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """``local[2,2]``: two cores, and a failed task is retried once (spark.task.maxFailures=2)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from txsink.spark.localspark import local_spark

    session = local_spark("local[2,2]", "txsink-tests")
    yield session
    session.stop()
