"""``format("txsink")`` (the Python Data Source path) on real queries, with crashes.

Each test runs the query in child processes (:mod:`txsink.runner`, restarted after each
crash on the same checkpoint) and reads the target back with the connector's own verifier:
zero duplicates, zero missing, nothing lingering (no prepared transaction, no staged file).

``SESSIONS`` is the kind of Spark session the query runs in; ``"connect"`` joins it once
the Spark Connect server fixture (issue 16, part 1) is merged: ``_run`` then passes
``remote=<the fixture's sc:// URL>`` to :func:`txsink.testing.pipelines.run_datasource`,
whose child connects with ``SparkSession.builder.remote(...)`` (the Data Source's driver-side
steps then run in the Connect server's Python workers; nothing in them needs a SparkContext).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import services_for
from txsink.runner import RunReport, python_module_cmd, run_until_done
from txsink.testing.adapter import adapter
from txsink.testing.inputs import make_input
from txsink.testing.verifiers import verify

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = "txsink.testing.pipelines:run_datasource"
ROWS, FILES = 400, 4
SESSIONS = ["classic"]  # Spark Connect: test_stream_through_spark_connect
#: Options whose values come from the environment (secrets stay off command lines).
ENV_OPTIONS: dict[str, dict[str, str]] = {
    "postgres": {"dsn": "TXSINK_PG_DSN"},
    "kafka": {"bootstrap_servers": "TXSINK_KAFKA_BOOTSTRAP"},
}
#: The S3 sink finds its server and credentials as boto3 does, from the environment (the
#: way to keep them out of options): AWS variable <- the test server's variable.
AWS_ENV = {
    "AWS_ENDPOINT_URL_S3": "TXSINK_S3_ENDPOINT",
    "AWS_ACCESS_KEY_ID": "TXSINK_S3_ACCESS_KEY",
    "AWS_SECRET_ACCESS_KEY": "TXSINK_S3_SECRET_KEY",
    "AWS_DEFAULT_REGION": "TXSINK_S3_REGION",
}
#: Postgres runs by default; the files sink's runs are behind --run-slow (its static run
#: and the unit tests cover it by default): each child run costs a Spark start.
CONNECTORS = [
    pytest.param("files", id="files", marks=pytest.mark.slow),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("kafka", id="kafka", marks=[pytest.mark.kafka, pytest.mark.slow]),
    pytest.param("s3", id="s3", marks=[pytest.mark.s3, pytest.mark.slow]),
]


def _options(spec: dict[str, Any]) -> dict[str, str]:
    """A testing adapter's target spec as ``format("txsink")`` options (strings)."""
    out = {}
    for key, value in spec.items():
        if key == "kind":
            continue
        if isinstance(value, bool):
            out[key] = str(value).lower()
        elif isinstance(value, list | tuple | dict):
            out[key] = json.dumps(list(value) if isinstance(value, tuple) else value)
        else:
            out[key] = str(value)
    return {"connector": str(spec["kind"]), **out}


def _run(
    tmp_path: Path,
    connector: str,
    *,
    fault: str = "",
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> tuple[RunReport, Any, list[str]]:
    """Run the query until it finishes; the report, the verdict and the child's lines."""
    found = adapter(connector)
    child = {**os.environ, **(env or {}), "TXSINK_FAULT": fault}
    if kwargs.get("remote"):  # a Connect client: no classic session's settings
        child.pop("PYSPARK_SUBMIT_ARGS", None)
        child.pop("SPARK_CONNECT_MODE_ENABLED", None)
    if connector == "s3":
        child |= {aws: os.environ[ours] for aws, ours in AWS_ENV.items() if ours in os.environ}
    child["TXSINK_FAULT_STATE"] = str(tmp_path / "faults")
    make_input(tmp_path / "input", ROWS, FILES)
    spec = found.new_target(tmp_path, tmp_path.name[-12:].lower().replace("-", "_"), child)
    try:
        args = {"workdir": str(tmp_path), "options": _options(spec), **kwargs}
        args["env_options"] = ENV_OPTIONS.get(connector, {})
        lines: list[str] = []
        report = run_until_done(
            python_module_cmd("txsink.runner", PIPELINE, json.dumps(args)),
            env=child,
            max_runs=5,
            on_line=lines.append,
            timeout=300,
        )
        verifier = found.verifier(spec, range(ROWS), child, log=str(tmp_path / "txlog"))
        return report, verify(verifier), lines
    finally:
        found.drop_target(spec, child)


def _exactly_once(verdict: Any, epochs: int = FILES) -> None:
    assert (verdict.duplicates, verdict.missing, verdict.unexpected) == (0, 0, 0), verdict
    assert verdict.lingering == 0, verdict
    if verdict.epochs:
        assert verdict.epochs == epochs, verdict


@pytest.mark.parametrize("session", SESSIONS)
@pytest.mark.parametrize("connector", CONNECTORS)
def test_stream_exactly_once_through_a_task_raise_and_a_killed_driver(
    request: pytest.FixtureRequest, tmp_path: Path, connector: str, session: str
) -> None:
    """Epoch 1: a task raises (no task retries: the batch aborts, the query fails); epoch 2:
    the driver process is killed right after the decision. Each run restarts on the same
    checkpoint; the decided epoch is committed by the next run's planning, its replay
    writes nothing."""
    services_for(request, [connector])
    report, verdict, lines = _run(
        tmp_path, connector, fault="before_precommit:raise@1,after_decision:kill-driver@2"
    )
    assert report.finished and report.runs == 3, (report, lines[-30:])
    assert "killed by SIGKILL" in report.endings[1], report.endings
    _exactly_once(verdict)


@pytest.mark.slow
@pytest.mark.parametrize("session", SESSIONS)
@pytest.mark.parametrize("connector", CONNECTORS)
def test_a_killed_task_attempts_transaction_is_found_and_aborted(
    request: pytest.FixtureRequest, tmp_path: Path, connector: str, session: str
) -> None:
    """The Python worker dies after its pre-commit (its transaction is prepared, nobody
    reports it); Spark's retry succeeds; the commit aborts the dead attempt's transaction."""
    services_for(request, [connector])
    report, verdict, lines = _run(
        tmp_path, connector, fault="after_precommit:kill-worker@1#0", master="local[2,2]"
    )
    assert report.finished and report.runs == 1, (report, lines[-30:])
    assert any("an attempt the decision of epoch 1 did not use" in line for line in lines)
    _exactly_once(verdict)


@pytest.mark.parametrize("session", SESSIONS)
def test_static_writes_through_a_killed_driver_and_automatic_registration(
    tmp_path: Path, session: str
) -> None:
    """``df.write.format("txsink")``, input file ``i`` as epoch ``i``, the driver killed
    after epoch 1's decision; the re-run writes epochs 0 and 1 nothing twice. The format is
    found by PySpark's automatic registration of ``pyspark_txsink`` (no register call)."""
    env = {"TXSINK_DS_AUTOREGISTER": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    report, verdict, lines = _run(
        tmp_path, "files", fault="after_decision:kill-driver@1", env=env, static=True
    )
    assert report.finished and report.runs == 2, (report, lines[-30:])
    _exactly_once(verdict)


@pytest.mark.parametrize("connector", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_stream_through_spark_connect(
    request: pytest.FixtureRequest, tmp_path: Path, connector: str, connect_server: Any
) -> None:
    """The same path through a Spark Connect session (the suite's real Connect server): the
    Data Source's planning, commit and abort run in the server's Python workers, which
    read no fault plan from this test (the server is shared by the session): a clean run,
    read back exactly once. Crashes under Connect are covered for foreachBatch in
    test_connect.py."""
    from connect_server import client_env

    services_for(request, [connector])
    env = {"PYTHONPATH": client_env(connect_server)["PYTHONPATH"]}
    report, verdict, lines = _run(tmp_path, connector, env=env, remote=connect_server.url)
    assert report.finished and report.runs == 1, (report, lines[-30:])
    _exactly_once(verdict)


@pytest.mark.slow
def test_a_wrong_option_fails_the_query_before_any_row(tmp_path: Path) -> None:
    """An unknown option: the query fails at its first planning, naming the option."""
    make_input(tmp_path / "input", 10, 1)
    options = {"connector": "files", "uid": "o", "path": str(tmp_path / "out"), "colour": "red"}
    args = {"workdir": str(tmp_path), "options": options}
    lines: list[str] = []
    report = run_until_done(
        python_module_cmd("txsink.runner", PIPELINE, json.dumps(args)),
        max_runs=1,
        on_line=lines.append,
        timeout=300,
    )
    assert not report.finished
    failed = [line for line in lines if line.startswith("txsink: query failed")]
    assert (
        failed
        and "ConfigurationError: [phase=check, connector=files] unknown option(s) ['colour']"
        in failed[0]
    ), lines[-20:]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_demo_via_datasource_kill_driver_at_every_point(tmp_path: Path) -> None:
    """``txsink demo --via datasource`` with the driver killed once at every crash point
    (task points from the task, driver points from the planning or commit worker)."""
    from tests.streaming import EVERY_POINT_ONCE
    from txsink.connectors.files.demo import run_demo

    result = run_demo(
        tmp_path / "demo",
        rows=6000,
        files=6,
        partitions=2,
        crash=EVERY_POINT_ONCE,
        fmt="parquet",
        max_runs=12,
        echo=False,
        via="datasource",
    )
    assert (result["faults_fired"], result["restarts"]) == (7, 7), result
    assert (result["duplicates"], result["missing"], result["lingering"]) == (0, 0, 0), result
    assert result["rows_written"] == 6000 and result["epochs"] == 6 and result["ok"], result
