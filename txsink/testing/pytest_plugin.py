"""The ``txsink`` pytest plugin: chaos fixtures for pipelines that use txsink.

Installed with the package (entry point ``pytest11: txsink``); nothing to configure.

Fixtures:

- ``chaos_workdir``: a fresh folder for one test (``tmp_path / "chaos"``).
- ``chaos_runner``: a :class:`ChaosRunner`; calling it runs a pipeline under a plan with
  :func:`txsink.testing.run_chaos` in ``chaos_workdir`` and fails the test (with the
  summary table) unless every sink reads back exactly once.
- ``chaos_seed``: the ``--chaos-seed`` option (default 0), for ``ChaosPlan.random``.

A test that uses ``chaos_runner`` gets the ``chaos`` marker, so ``-m "not chaos"`` skips
it. This module imports neither pyspark nor the connectors: loading it costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from txsink.testing.chaos import ChaosReport
    from txsink.testing.chaos.plan import ChaosPlan
    from txsink.testing.verifiers import SinkVerifier

__all__ = ["ChaosRunner"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("txsink", "txsink chaos testing")
    group.addoption(
        "--chaos-seed",
        type=int,
        default=None,
        help="seed for the chaos_seed fixture (random chaos plans); default 0",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: fault-injection runs (txsink chaos toolkit; crash and restart)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "chaos_runner" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.chaos)


class ChaosRunner:
    """Runs pipelines under chaos plans in one test's folder; keeps every report."""

    def __init__(self, workdir: Path, echo: Callable[[str], None] = print) -> None:
        self.workdir = workdir
        self.echo = echo
        self.reports: list[ChaosReport] = []

    def __call__(
        self,
        pipeline: str,
        plan: ChaosPlan | str,
        *,
        sinks_verifiers: Mapping[str, SinkVerifier],
        args: Mapping[str, Any] | None = None,
        check: bool = True,
        **options: Any,
    ) -> ChaosReport:
        """:func:`txsink.testing.run_chaos` in this test's folder (``workdir=`` overrides).

        With ``check`` (the default) a run that is not exactly-once in every sink fails
        the test with the summary table.
        """
        from txsink.testing.chaos import run_chaos

        options.setdefault("workdir", self.workdir)
        options.setdefault("on_progress", self.echo)
        report = run_chaos(pipeline, plan, sinks_verifiers=sinks_verifiers, args=args, **options)
        self.reports.append(report)
        self.echo(report.table())
        if check and not report.ok:
            pytest.fail("chaos run failed the exactly-once check\n" + report.table())
        return report


@pytest.fixture
def chaos_workdir(tmp_path: Path) -> Path:
    """A fresh folder for the chaos runs of one test."""
    folder = tmp_path / "chaos"
    folder.mkdir()
    return folder


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    """``--chaos-seed`` (default 0)."""
    value = request.config.getoption("--chaos-seed")
    return 0 if value is None else int(value)


@pytest.fixture
def chaos_runner(chaos_workdir: Path) -> ChaosRunner:
    """Call it like ``run_chaos`` without ``workdir``; it asserts the verdict."""
    return ChaosRunner(chaos_workdir)
