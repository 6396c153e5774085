"""``format("txsink")`` (the Python Data Source path) on real queries, with crashes.

Each test runs the query in child processes (:mod:`txsink.runner`, restarted after each
crash on the same checkpoint) and reads the target back with the connector's own verifier:
zero duplicates, zero missing, nothing lingering (no prepared transaction, no staged file).

``SESSIONS`` is the kind of classic Spark session the query runs in. Under Spark Connect
(``remote=<sc:// URL>`` to :func:`txsink.testing.pipelines.run_datasource`) the Data Source's
planning, commit, abort and tasks run in the Connect server's Python workers, which inherit
the *server's* environment: the crash test there starts a server of its own with the fault
plan in it (``kill-driver`` then kills the server's JVM, the driver).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import services_for
from tests.childrun import demo, run_pipeline, runner_cmd
from txsink.protocol.log import open_log
from txsink.runner import RunReport
from txsink.spark.versions import STREAM_DATA_SOURCE_LINE, spark_version
from txsink.testing.adapter import adapter
from txsink.testing.inputs import make_input
from txsink.testing.verifiers import verify

# Starts Spark drivers in child processes: the session builds the CDS archive first.
# The Python Data Source is Spark 4's (on 3.5 txsink refuses the format at once:
# tests/test_spark_versions.py pins that), and its streaming writer takes Arrow batches from
# 4.1 (on 4.0 txsink refuses writeStream.format("txsink"); static writes run there).
pytestmark = [pytest.mark.spark, pytest.mark.spark_line("4")]
STREAMING = pytest.mark.skipif(
    spark_version()[:2] < STREAM_DATA_SOURCE_LINE,
    reason="writeStream.format('txsink') needs Spark 4.1 (refused on 4.0: "
    "tests/test_spark_versions.py)",
)

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = "txsink.testing.pipelines:run_datasource"
ROWS, FILES = 400, 4
SESSIONS = ["classic"]  # Spark Connect: the two tests that take a Connect server
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

#: The compatibility matrix's run of the Data Source (``--matrix``, every Spark line): the
#: streaming test through Postgres.
MATRIX_CONNECTORS = [
    pytest.param(*p.values, id=p.id, marks=[*p.marks, pytest.mark.matrix("datasource")])
    if p.id == "postgres"
    else p
    for p in CONNECTORS
]


def _options(found: Any, spec: dict[str, Any]) -> dict[str, str]:
    """A testing adapter's target spec as ``format("txsink")`` options (strings)."""
    out = {}
    for key, value in found.sink_options(spec).items():
        if isinstance(value, bool):
            out[key] = str(value).lower()
        elif isinstance(value, list | tuple | dict):
            out[key] = json.dumps(list(value) if isinstance(value, tuple) else value)
        else:
            out[key] = str(value)
    return {"connector": str(spec["kind"]), **out}


def _aws_env() -> dict[str, str]:
    return {aws: os.environ[ours] for aws, ours in AWS_ENV.items() if ours in os.environ}


@contextlib.contextmanager
def _target(
    tmp_path: Path, connector: str, env: dict[str, str] | None = None, **kwargs: Any
) -> Iterator[tuple[Any, dict[str, Any], dict[str, str], list[str]]]:
    """A fresh target and input: the adapter, its spec, the child's environment and the
    child's command; the target is dropped afterwards."""
    found = adapter(connector)
    child = {**os.environ, **(env or {}), "TXSINK_FAULT": kwargs.pop("fault", "")}
    if kwargs.get("remote"):  # a Connect client: no classic session's settings
        child.pop("PYSPARK_SUBMIT_ARGS", None)
        child.pop("SPARK_CONNECT_MODE_ENABLED", None)
    if connector == "s3":
        child |= _aws_env()
    child["TXSINK_FAULT_STATE"] = str(tmp_path / "faults")
    make_input(tmp_path / "input", ROWS, FILES)
    spec = found.new_target(tmp_path, tmp_path.name[-12:].lower().replace("-", "_"), child)
    try:
        args = {"workdir": str(tmp_path), "options": _options(found, spec), **kwargs}
        args["env_options"] = ENV_OPTIONS.get(connector, {})
        yield found, spec, child, runner_cmd(PIPELINE, args)
    finally:
        found.drop_target(spec, child)


def _run(
    tmp_path: Path,
    connector: str,
    *,
    fault: str = "",
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> tuple[RunReport, Any, list[str]]:
    """Run the query until it finishes; the report, the verdict and the child's lines."""
    with _target(tmp_path, connector, env, fault=fault, **kwargs) as (found, spec, child, cmd):
        report, lines = run_pipeline(cmd, env=child, max_runs=5)
        verifier = found.verifier(spec, range(ROWS), child, log=str(tmp_path / "txlog"))
        return report, verify(verifier), lines


def _exactly_once(verdict: Any, epochs: int = FILES) -> None:
    assert (verdict.duplicates, verdict.missing, verdict.unexpected) == (0, 0, 0), verdict
    assert verdict.lingering == 0, verdict
    if verdict.epochs:
        assert verdict.epochs == epochs, verdict


@STREAMING
@pytest.mark.parametrize("session", SESSIONS)
@pytest.mark.parametrize("connector", MATRIX_CONNECTORS)
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


@STREAMING
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


def _broken_distribution(site: Path) -> Path:
    """A folder holding a distribution that registers connector ``gone``, whose module does
    not exist; put it on ``PYTHONPATH`` (Spark's Python workers inherit it)."""
    info = site / "gone_connectors-0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gone-connectors\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        "[txsink.connectors]\ngone = txsink_gone_checkout_module.plugin:CONNECTOR\n"
    )
    return site


#: How PySpark's lookup lists Python Data Sources (``pkgutil.iter_modules()`` in a fresh
#: worker), and where the module it would import comes from.
_LOOKUP = """
import importlib.util, json, os, pkgutil
listed = [m.name for m in pkgutil.iter_modules() if m.name == "pyspark_txsink"]
spec = importlib.util.find_spec("pyspark_txsink")
print(json.dumps({"listed": listed, "origin": spec and spec.origin}))
"""


@pytest.mark.parametrize("session", SESSIONS)
def test_static_writes_through_a_killed_driver_and_automatic_registration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, session: str
) -> None:
    """``df.write.format("txsink")``, input file ``i`` as epoch ``i``, the driver killed
    after epoch 1's decision; the re-run writes epochs 0 and 1 nothing twice. The format is
    found by PySpark's automatic registration of ``pyspark_txsink`` (no register call).

    It tests the install, not the checkout: the children run with no ``PYTHONPATH`` and
    outside the repository (``python -m`` and Spark's ``python -m pyspark.daemon`` put the
    working folder on ``sys.path``, where the root's ``pyspark_txsink.py`` would hide an
    install that does not list it). In the venv that ``./dev`` installs editable, the
    module is found through the ``.pth`` the build backend adds (build-backend/).

    A second distribution registers a connector whose module is gone (an editable install
    of a deleted checkout): only that connector is broken, the files connector works."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(_broken_distribution(tmp_path / "site")))
    # First, the lookup as PySpark's worker makes it: a broken install fails here, clearly.
    proc = subprocess.run(
        [os.environ.get("PYSPARK_PYTHON", sys.executable), "-c", _LOOKUP],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    found = json.loads(proc.stdout)
    assert found["listed"] == ["pyspark_txsink"], (
        f"this environment's install does not list pyspark_txsink as PySpark's lookup does "
        f"({found}): reinstall with pip install -e . (or ./dev)"
    )
    assert Path(found["origin"]).parent != ROOT, found  # not the checkout's own file
    env = {"TXSINK_DS_AUTOREGISTER": "1"}
    report, verdict, lines = _run(
        tmp_path, "files", fault="after_decision:kill-driver@1", env=env, static=True
    )
    assert report.finished and report.runs == 2, (report, lines[-30:])
    _exactly_once(verdict)


@STREAMING
@pytest.mark.parametrize("connector", CONNECTORS)
def test_stream_through_spark_connect_with_crashes_in_the_server(
    request: pytest.FixtureRequest, tmp_path: Path, connector: str
) -> None:
    """The same path through a Spark Connect session, against a Connect server of its own
    whose environment carries the fault plan (the Data Source's planning, commit and tasks
    run in the server's Python workers): a task raises (Spark retries it), a task's worker
    is SIGKILLed after its pre-commit (retried; the dead attempt's prepared transaction is
    aborted), and the server itself (the driver: its JVM) is SIGKILLed right after epoch 2's
    decision. The server restarts, a new client starts the query again on its checkpoint,
    and the decided epoch is committed before anything else; read back exactly once."""
    from connect_server import ConnectServer, client_env

    services_for(request, [connector])
    plan = "before_precommit:raise@0#0,after_precommit:kill-worker@1#1,after_decision:kill-driver@2"
    server_env = {"TXSINK_FAULT": plan, "TXSINK_FAULT_STATE": str(tmp_path / "faults")}
    if connector == "s3":  # boto3's chain on the driver: the server's environment
        server_env |= _aws_env()
    server = ConnectServer.start_new(tmp_path / "server", env=server_env)
    env = {"PYTHONPATH": client_env(server)["PYTHONPATH"]}
    try:
        with _target(tmp_path, connector, env, remote=server.url) as (found, spec, child, cmd):
            first = subprocess.Popen(
                cmd, env=child, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                deadline = time.monotonic() + 240
                while server.proc is not None and server.proc.poll() is None:
                    assert time.monotonic() < deadline, "the server was not killed at epoch 2"
                    assert first.poll() is None, f"the client ended first: {first.returncode}"
                    time.sleep(0.1)
            finally:  # it retries a server that is gone (Connect's retry policy)
                first.kill()
                first.wait(30)
            log = open_log(tmp_path / "txlog")
            assert log.decision(2) is not None and log.committed(2) is None
            server.restart()
            report, lines = run_pipeline(cmd, env=child, max_runs=2)
            assert report.finished and report.runs == 1, (report, lines[-30:])
            verdict = verify(found.verifier(spec, range(ROWS), child, log=str(tmp_path / "txlog")))
    finally:
        server.stop()
    fired = sorted(os.listdir(tmp_path / "faults"))
    assert len(fired) == 3, fired
    served = "".join(p.read_text(errors="replace") for p in server.workdir.glob("*.log"))
    assert "an attempt the decision of epoch 1 did not use" in served, served[-3000:]
    _exactly_once(verdict)


@STREAMING
@pytest.mark.slow
@pytest.mark.parametrize("connector", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_killed_connect_client(
    request: pytest.FixtureRequest, tmp_path: Path, connector: str, connect_server: Any
) -> None:
    """SIGKILL of the Connect client once epoch 1 is decided: the query lives on in the
    server (or is stopped when the next client starts it again on the same checkpoint);
    either way every row exactly once."""
    from connect_server import client_env

    services_for(request, [connector])
    env = {"PYTHONPATH": client_env(connect_server)["PYTHONPATH"]}
    with _target(tmp_path, connector, env, remote=connect_server.url) as (found, spec, child, cmd):
        first = subprocess.Popen(
            cmd, env=child, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 240
            while not _decided(tmp_path / "txlog", 1):
                assert time.monotonic() < deadline and first.poll() is None, first.returncode
                time.sleep(0.05)
        finally:
            first.kill()
            first.wait(30)
        report, lines = run_pipeline(cmd, env=child, max_runs=2)
        assert report.finished, (report, lines[-30:])
        verdict = verify(found.verifier(spec, range(ROWS), child, log=str(tmp_path / "txlog")))
    _exactly_once(verdict)


def _decided(log_dir: Path, epoch: int) -> bool:
    return log_dir.is_dir() and open_log(log_dir).decision(epoch) is not None


@STREAMING
@pytest.mark.slow
def test_a_wrong_option_fails_the_query_before_any_row(tmp_path: Path) -> None:
    """An unknown option: the query fails at its first planning, naming the option."""
    make_input(tmp_path / "input", 10, 1)
    options = {"connector": "files", "uid": "o", "path": str(tmp_path / "out"), "colour": "red"}
    args = {"workdir": str(tmp_path), "options": options}
    report, lines = run_pipeline(runner_cmd(PIPELINE, args), max_runs=1)
    assert not report.finished
    failed = [line for line in lines if line.startswith("txsink: query failed")]
    assert (
        failed
        and "ConfigurationError: [phase=check, connector=files] unknown option(s) ['colour']"
        in failed[0]
    ), lines[-20:]
    assert not (tmp_path / "out").exists()


@STREAMING
@pytest.mark.slow
def test_demo_via_datasource_kill_driver_at_every_point(tmp_path: Path) -> None:
    """``txsink demo --via datasource`` with the driver killed once at every crash point
    (task points from the task, driver points from the planning or commit worker)."""
    from tests.streaming import EVERY_POINT_ONCE

    result = demo(
        tmp_path / "demo", rows=6000, files=6, crash=EVERY_POINT_ONCE, max_runs=12, via="datasource"
    )
    assert (result["faults_fired"], result["restarts"]) == (7, 7), result
    assert (result["duplicates"], result["missing"], result["lingering"]) == (0, 0, 0), result
    assert result["rows_written"] == 6000 and result["epochs"] == 6 and result["ok"], result
