"""The compatibility matrix's selection and its results (docs/testing.md, "The compatibility
matrix"; docs/compatibility.md is generated from the results).

A test that stands for a feature in the matrix carries ``@pytest.mark.matrix("feature")``
(a parametrized test: on the chosen parameters only). ``pytest --matrix`` runs those tests
alone, the slow ones among them included, on whatever Spark line the interpreter has;
``--matrix-json PATH`` writes each one's outcome, by feature, to ``PATH``. ``./dev matrix``
runs that in each line's venv and ``docs/tools/compatibility.py`` turns the files into the
page.

Two keywords say what a passing test shows when it is not the feature working:

- ``refused="why"``: the test checks that txsink refuses the feature on this line, by
  design (the Python Data Source on 3.5): the page says "refused by design" and why.
- ``note="what"``: the feature passes in another form on this line (3.5 has no Arrow byte
  cap to lift): the page says "pass" and the note.

The results file is one JSON object: the versions measured (PySpark, Python, pyarrow,
Java), when, the run's exit status, and per feature the counts of passed, failed and
skipped tests with each test's outcome.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["FEATURES", "MatrixRecorder", "add_options", "select"]

#: The features of the matrix, in the page's order: key -> what the page calls it.
FEATURES: dict[str, str] = {
    "foreachBatch": "`foreachBatch(coordinator)`: crash matrix, one cell per crash point "
    "(files, Postgres, Kafka WAL, S3, Iceberg, Delta)",
    "write": "`coordinator.write(df)` (a static DataFrame)",
    "direct": "Kafka direct mode (single pass, barrier `mapInArrow`)",
    "contract": "The sink contract, every connector (its first variant, and Kafka direct)",
    "connect": "Spark Connect `foreachBatch`",
    "datasource": 'Python Data Source (`writeStream.format("txsink")`)',
    "demo": "`txsink demo --crash after_decision:kill-driver`",
    "delta_reader": "Delta Lake's Spark reads the Delta connector's tables",
    "iceberg_reader": "Iceberg's Spark runtime reads the Iceberg connector's tables",
    "arrow_schema": "The first batch's Arrow schema check (the #38 regression)",
    "byte_cap": "Arrow batch byte cap lifted for txsink's jobs",
    "schema_evolution": "Schema evolution: a stream gains a column and widens one (files); five "
    "targets gain a column in one epoch cut mid-commit (Postgres, Kafka Avro, S3, Iceberg, Delta)",
}


def add_options(parser: pytest.Parser) -> None:
    parser.addoption(
        "--matrix",
        action="store_true",
        default=os.environ.get("TXSINK_MATRIX") == "1",
        help="run only the compatibility matrix's tests (marked matrix), slow ones included "
        "(default: $TXSINK_MATRIX=1); ./dev matrix runs it per Spark line",
    )
    parser.addoption(
        "--matrix-json",
        default=None,
        metavar="PATH",
        help="write the matrix tests' outcomes by feature to PATH (JSON; docs/compatibility.md "
        "is generated from these files)",
    )


def select(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--matrix``: deselect every test not marked ``matrix`` (the others of a
    parametrized test's parameters too), and check each mark names a known feature."""
    for item in items:
        mark = item.get_closest_marker("matrix")
        if mark is not None and (not mark.args or mark.args[0] not in FEATURES):
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.matrix needs one of {sorted(FEATURES)} "
                f"(tests/matrixrun.py), not {mark.args!r}"
            )
    if not config.getoption("--matrix"):
        return
    keep = [item for item in items if item.get_closest_marker("matrix") is not None]
    dropped = [item for item in items if item.get_closest_marker("matrix") is None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


@dataclass
class _Outcome:
    feature: str
    refused: str | None
    note: str | None
    outcome: str = "not run"
    reason: str = ""
    seconds: float = 0.0


@dataclass(eq=False)  # a plugin must hash (pluggy keeps plugins in sets)
class MatrixRecorder:
    """A pytest plugin: the outcome of each test marked ``matrix``, written at the end."""

    path: Path
    started: float = field(default_factory=time.monotonic)
    tests: dict[str, _Outcome] = field(default_factory=dict)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            mark = item.get_closest_marker("matrix")
            if mark is not None and mark.args:
                self.tests[item.nodeid] = _Outcome(
                    mark.args[0], mark.kwargs.get("refused"), mark.kwargs.get("note")
                )

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            self.tests.pop(item.nodeid, None)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = self.tests.get(report.nodeid)
        if found is None:
            return
        found.seconds += report.duration
        for key, value in report.user_properties:
            if key == "matrix_note":  # the test's own word on what it ran (record_property)
                found.note = str(value)
        if report.failed:
            found.outcome = "failed"
            crash = getattr(report.longrepr, "reprcrash", None)
            said = crash.message if crash is not None else _last_line(report.longreprtext)
            found.reason = f"{report.when}: {' '.join(said.split())[:300]}"
        elif report.skipped and found.outcome != "failed":
            found.outcome = "skipped"
            found.reason = _skip_reason(report)
        elif report.when == "call" and report.passed and found.outcome != "failed":
            found.outcome = "passed"

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        features: dict[str, dict[str, Any]] = {}
        for nodeid, test in self.tests.items():
            entry = features.setdefault(
                test.feature, {"passed": 0, "failed": 0, "skipped": 0, "tests": []}
            )
            if test.outcome in ("passed", "failed", "skipped"):
                entry[test.outcome] += 1
            entry["tests"].append(
                {
                    "test": nodeid,
                    "outcome": test.outcome,
                    "reason": test.reason,
                    "seconds": round(test.seconds, 1),
                    **({"refused": test.refused} if test.refused else {}),
                    **({"note": test.note} if test.note else {}),
                }
            )
        result = {
            **versions(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "seconds": round(time.monotonic() - self.started, 1),
            "exit_status": int(exitstatus),
            "features": features,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


def versions() -> dict[str, str]:
    """The versions a result was measured with."""
    import pyarrow
    import pyspark

    from txsink.spark.versions import spark_line

    return {
        "line": spark_line(),
        "pyspark": pyspark.__version__,
        "python": platform.python_version(),
        "pyarrow": pyarrow.__version__,
        "java": _java_version(),
        "executable": sys.executable,
    }


def _java_version() -> str:
    try:
        done = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return "unknown"
    first = (done.stderr or done.stdout).strip().splitlines()
    return first[0].split('"')[1] if first and '"' in first[0] else "unknown"


def _skip_reason(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return _last_line(report.longreprtext)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
