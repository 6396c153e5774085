"""Fixtures for tests/ and integration/: one local SparkSession per test session (~7 s to start)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="also run the slow tests (one subprocess run per crash point)",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build the Spark class-data-sharing archive once (~45 s on a fresh machine): every
    driver the tests start afterwards (dozens of child runs) starts ~5 s faster."""
    from txsink._jvmcds import ensure_archive

    ensure_archive()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow") or os.environ.get("TXSINK_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow or TXSINK_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """``local[2,2]``: two cores, and a failed task is retried once (spark.task.maxFailures=2)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from txsink.localspark import local_spark

    session = local_spark("local[2,2]", "txsink-tests")
    yield session
    session.stop()
