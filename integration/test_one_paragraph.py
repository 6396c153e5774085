"""One failure, one paragraph (issue 35, point 2): a query that fails because of txsink,
run as a user runs it (``python job.py``, stdout and stderr captured), prints txsink's
error once, first, as one paragraph naming the sink, the phase, the cause and the fix;
Spark's and py4j's traces go to a file that the last line names, which holds them whole.

Against the real servers: a NULL into a Postgres NOT NULL column (pre-commit), a missing
Postgres table (the start-up check), an unreachable Kafka broker (``127.0.0.1:1``); the
first also through the Data Source path (``writeStream.format("txsink")``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from connect_server import ConnectServer, client_env

pytestmark = [pytest.mark.spark]

_JOB = """\
import os, sys
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession
from txsink import Coordinator
{imports}


def pipeline():
    return Coordinator([{sink}], log="data/txsink-log")


if __name__ == "__main__":
    spark = SparkSession.builder.master("local[2]").getOrCreate()
    coordinator = pipeline()
    query = (
        spark.readStream.format("rate").option("rowsPerSecond", 20).load()
        .selectExpr({columns})
        .writeStream.foreachBatch(coordinator)
        .option("checkpointLocation", "data/checkpoint")
        .trigger(processingTime="1 second")
        .start()
    )
    query.awaitTermination(90)
"""

_DATASOURCE_JOB = """\
import os, sys
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession
from txsink.datasource import register

spark = SparkSession.builder.master("local[2]").getOrCreate()
register(spark)
query = (
    spark.readStream.format("rate").option("rowsPerSecond", 20).load()
    .selectExpr({columns})
    .writeStream.format("txsink")
    .option("connector", "postgres").option("dsn", os.environ["TXSINK_PG_DSN"])
    .option("table", "{table}").option("uid", "orders").option("log", "data/txsink-log")
    .option("checkpointLocation", "data/checkpoint")
    .trigger(processingTime="1 second")
    .start()
)
query.awaitTermination(90)
"""

_CONNECT_JOB = """\
import os
from pyspark.sql import SparkSession
from txsink import Coordinator
from txsink.connectors.postgres import PostgresSink

spark = SparkSession.builder.remote(os.environ["TXSINK_TEST_CONNECT_URL"]).getOrCreate()
coordinator = Coordinator(
    [PostgresSink(os.environ["TXSINK_PG_DSN"], "{table}", uid="orders")],
    log=os.path.abspath("data/txsink-log"),
    app_id="orders-app",
)
query = (
    spark.readStream.format("rate").option("rowsPerSecond", 20).load()
    .selectExpr("value AS id", "CONCAT('n', value) AS name")
    .writeStream.foreachBatch(coordinator)
    .option("checkpointLocation", os.path.abspath("data/checkpoint"))
    .trigger(processingTime="1 second")
    .start()
)
query.awaitTermination(90)
"""

_OUTAGE_JOB = """\
import os, sys
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pyspark.sql import SparkSession
from txsink import Coordinator
from txsink.connectors.postgres import PostgresSink
from txsink.testing.netproxy import NetProxy

# The server, reached through a proxy that the second batch cuts: an outage that
# outage_s=0 does not ride out, so the tasks' RetryableError ends the query.
params = conninfo_to_dict(os.environ["TXSINK_PG_DSN"])
proxy = NetProxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
proxy.start()
params.update(host="127.0.0.1", port=str(proxy.port))
sink = PostgresSink(make_conninfo("", **params), "{table}", uid="orders")
coordinator = Coordinator([sink], log="data/txsink-log", outage_s=0)


def batch(df, epoch):
    if epoch == 1:
        proxy.cut()
    coordinator(df, epoch)


spark = SparkSession.builder.master("{master}").getOrCreate()
query = (
    spark.readStream.format("rate").option("rowsPerSecond", 20).load()
    .selectExpr("value AS id", "CONCAT('n', value) AS name")
    .writeStream.foreachBatch(batch)
    .option("checkpointLocation", "data/checkpoint")
    .trigger(processingTime="1 second")
    .start()
)
query.awaitTermination(90)
"""

_NULL_COLUMNS = '"value AS id", "IF(value = 3, NULL, CONCAT(\'n\', value)) AS name"'
_PG_IMPORTS = "from txsink.connectors.postgres import PostgresSink"
#: A line that tells of the failure (Spark's ERROR records, a traceback, an exception).
_FAILURE = re.compile(r"ERROR|Traceback|Exception|Error: |terminated with|failed")
#: txsink's per-epoch lines (``txsink: [uid epoch N] committed: …``), told before it.
_EPOCH_LINE = re.compile(r"^txsink: \[[^\]]+ epoch \d+\] ")


def _run(tmp_path: Path, script: str, env: dict[str, str]) -> tuple[str, Path]:
    job = tmp_path / "job.py"
    job.write_text(script)
    traces = tmp_path / "traces"
    run_env = {
        **os.environ,
        **env,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "TXSINK_TRACE_DIR": str(traces),
    }
    run_env.pop("TXSINK_TRACEBACK", None)
    if "TXSINK_TEST_CONNECT_URL" in env:  # a Connect client: no classic session's settings
        run_env.pop("PYSPARK_SUBMIT_ARGS", None)
        run_env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    done = subprocess.run(
        [sys.executable, str(job)],
        check=False,
        cwd=tmp_path,
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0, f"the job did not fail:\n{done.stdout}"
    return done.stdout, traces


def _lines(output: str) -> list[str]:
    # Spark's progress bar may share a line with txsink's (issue 35, point 3): txsink's part.
    out = []
    for line in output.splitlines():
        at = line.find("txsink: ")
        out.append(line[at:] if at > 0 and line.lstrip().startswith("[Stage") else line)
    return out


def _assert_one_paragraph(output: str, traces: Path, *, cause: str, parts: list[str]) -> None:
    """The first line telling of the failure is txsink's paragraph (with ``parts``), the
    ``cause`` is told once, and the last line names a trace file that holds it all."""
    lines = _lines(output)
    failing = [
        i for i, line in enumerate(lines) if _FAILURE.search(line) and not _EPOCH_LINE.match(line)
    ]
    assert failing, output
    first = lines[failing[0]]
    assert first.startswith("txsink: ERROR ["), output
    for part in parts:
        assert part in first, (part, first)
    assert output.count(cause) == 1, output
    assert lines[-1].startswith("txsink: the query stopped on the error above"), output
    named = re.search(r" is in (\S+\.txt)$", lines[-1])
    assert named, lines[-1]
    trace = Path(named[1])
    assert trace.parent == traces.resolve() and trace.is_file(), trace
    text = trace.read_text()
    assert cause in text and "Traceback (most recent call last)" in text, text[:2000]
    assert "StreamingQueryException" in text, text[:2000]
    assert "\tat org.apache.spark." in text, text[:2000]  # the JVM's trace, whole
    # Below the paragraph: nothing but the trace file's line.
    assert lines[failing[0] + 1 :] == lines[-1:], output


@pytest.mark.postgres
def test_a_null_into_not_null_is_one_paragraph(postgres: Any, tmp_path: Path) -> None:
    schema = postgres.new_schema("para")
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {schema}.t (id bigint PRIMARY KEY, name text NOT NULL)")
    sink = f'PostgresSink(os.environ["TXSINK_PG_DSN"], "{schema}.t", uid="orders")'
    script = _JOB.format(imports=_PG_IMPORTS, sink=sink, columns=_NULL_COLUMNS)
    output, traces = _run(tmp_path, script, postgres.env())
    _assert_one_paragraph(
        output,
        traces,
        cause="violates not-null constraint",
        parts=["[orders epoch ", "phase=precommit", "column=name", "key id=3", "Fix or filter"],
    )


@pytest.mark.postgres
def test_a_missing_table_is_one_paragraph(postgres: Any, tmp_path: Path) -> None:
    schema = postgres.new_schema("para")
    sink = f'PostgresSink(os.environ["TXSINK_PG_DSN"], "{schema}.missing", uid="orders")'
    script = _JOB.format(imports=_PG_IMPORTS, sink=sink, columns=_NULL_COLUMNS)
    output, traces = _run(tmp_path, script, postgres.env())
    _assert_one_paragraph(
        output,
        traces,
        cause=f"table {schema}.missing does not exist",
        parts=["[orders epoch 0]", "phase=check", "create_table=True"],
    )


def test_an_unreachable_broker_is_one_paragraph(tmp_path: Path) -> None:
    sink = 'KafkaSink("127.0.0.1:1", "events", uid="events", wal="data/wal", timeout_s=3)'
    imports = "from txsink.connectors.kafka import KafkaSink"
    columns = '"CAST(value AS STRING) AS key", "CAST(value AS STRING) AS value"'
    output, traces = _run(tmp_path, _JOB.format(imports=imports, sink=sink, columns=columns), {})
    _assert_one_paragraph(
        output,
        traces,
        cause="cannot list the topics at 127.0.0.1:1",
        parts=["[events epoch 0]", "phase=check", "check bootstrap_servers"],
    )


#: Spark's records of a Data Source write it aborts (no exception attached): told after
#: the paragraph, with txsink's line of the abort it ran.
_DS_ABORT = re.compile(
    r"ERROR WriteToDataSourceV2Exec: Data source write support .* (is aborting|aborted)\.$"
    r"|^txsink: \[\w+ epoch \d+\] aborted \S+: Spark aborted epoch \d+$"
)


@pytest.mark.postgres
def test_a_null_through_the_data_source_is_one_paragraph(postgres: Any, tmp_path: Path) -> None:
    """The Data Source path: the commit runs in a Python worker of Spark's, which prints
    txsink's paragraph first; Spark's ``terminated with error`` record is denied by the
    filter ``register(spark)`` added from the user's process (:mod:`txsink.spark.jvmlog`), and
    the user's process prints no traceback, only the trace file's path."""
    schema = postgres.new_schema("para")
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {schema}.t (id bigint PRIMARY KEY, name text NOT NULL)")
    script = _DATASOURCE_JOB.format(columns=_NULL_COLUMNS, table=f"{schema}.t")
    output, traces = _run(tmp_path, script, postgres.env())
    lines = [line for line in _lines(output) if not _DS_ABORT.search(line)]
    _assert_one_paragraph(
        "\n".join(lines),
        traces,
        cause="violates not-null constraint",
        parts=["[orders epoch ", "phase=precommit", "column=name", "id=3", "Fix or filter"],
    )
    assert "terminated with error" not in output, output


@pytest.mark.postgres
def test_a_missing_table_through_the_data_source_is_one_paragraph(
    postgres: Any, tmp_path: Path
) -> None:
    """A refusal at the Data Source's planning (the start-up check in ``streamWriter``)
    reaches the driver as txsink's error: no ``PicklingError`` traceback printed by the
    planning worker, no Spark record of the query's end."""
    schema = postgres.new_schema("para")
    script = _DATASOURCE_JOB.format(columns=_NULL_COLUMNS, table=f"{schema}.missing")
    output, traces = _run(tmp_path, script, postgres.env())
    _assert_one_paragraph(
        output,
        traces,
        cause=f"table {schema}.missing does not exist",
        parts=["[orders] ConfigurationError", "phase=check", "create_table=True"],
    )
    assert "Pickl" not in output and "terminated with error" not in output, output
    assert "PicklingError" not in (traces / os.listdir(traces)[0]).read_text()


@pytest.mark.postgres
def test_a_missing_table_through_spark_connect_is_one_paragraph(
    postgres: Any, connect_server: ConnectServer, tmp_path: Path
) -> None:
    """Through Spark Connect the coordinator runs in the server, whose console is its log:
    the client prints the paragraph (carried in the error's note) first, and the path of
    the trace file it wrote on the client's machine; the server's log has its own lines."""
    schema = postgres.new_schema("para")
    script = _CONNECT_JOB.format(table=f"{schema}.missing")
    env = {**client_env(connect_server), **postgres.env()}
    env["TXSINK_TEST_CONNECT_URL"] = connect_server.url
    output, traces = _run(tmp_path, script, env)
    cause = f"table {schema}.missing does not exist"
    told = [line for line in _lines(output) if _FAILURE.search(line)]
    assert len(told) == 2, output
    assert told[0].startswith("txsink: ERROR [orders epoch 0] ConfigurationError: "), output
    assert "phase=check" in told[0] and cause in told[0] and "create_table=True" in told[0]
    assert output.count(cause) == 1, output
    assert told[1].startswith("txsink: the query stopped on this error (StreamingQuery"), output
    named = re.search(r" is in (\S+\.txt)$", told[1])
    assert named, told[1]
    trace = Path(named[1])  # on the client's machine, under TXSINK_TRACE_DIR
    assert trace.parent == traces.resolve() and trace.is_file(), trace
    text = trace.read_text()
    assert cause in text and "Found error inside foreachBatch Python process" in text, text
    assert "JVM stacktrace:" in text, text[:3000]
    served = connect_server.log_path.read_text(errors="replace")
    assert "txsink: ERROR [orders epoch 0] ConfigurationError: " in served and cause in served


#: Spark's records of a failed task (what the filter of :mod:`txsink.spark.jvmlog` denies).
_TASK_RECORDS = re.compile(r"Exception in task|Lost task|aborting job|terminated with error")


@pytest.mark.postgres
@pytest.mark.parametrize("master", ["local[2]", "local[2,2]"])
def test_a_task_failure_that_ends_the_query_is_one_paragraph(
    postgres: Any, tmp_path: Path, master: str
) -> None:
    """A target gone while the tasks write (a ``RetryableError`` in each task): Spark's
    records of the failed tasks (the executor's trace, the scheduler's ``Lost task`` with
    the Python traceback, ``aborting job``) are not printed; the paragraph is the first
    ERROR. With a retry (``local[2,2]``) each attempt Spark runs again is one WARNING line
    of txsink's."""
    schema = postgres.new_schema("para")
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {schema}.t (id bigint PRIMARY KEY, name text NOT NULL)")
    script = _OUTAGE_JOB.format(table=f"{schema}.t", master=master)
    output, traces = _run(tmp_path, script, postgres.env())
    lines = _lines(output)
    assert not [line for line in lines if _TASK_RECORDS.search(line)], output
    errors = [i for i, line in enumerate(lines) if "ERROR" in line or "Traceback" in line]
    first = lines[errors[0]]
    assert first.startswith("txsink: ERROR [orders epoch 1] EpochAbortedError: "), output
    assert "a task failed: txsink.errors.RetryableError: " in first, first
    assert "phase=begin" in first and "cannot connect to PostgreSQL" in first, first
    assert lines[errors[0] + 1 :] == lines[-1:], output  # then only the trace file's line
    assert lines[-1].startswith("txsink: the query stopped on the error above"), output
    retried = [line for line in lines if "Spark runs it again" in line]
    if master == "local[2]":  # no retry: the first failure fails the job
        assert not retried, output
    else:
        assert retried and all(
            line.startswith("txsink: WARNING [orders epoch 1] task ")
            and "(attempt 1 of 2) failed, Spark runs it again: RetryableError: " in line
            for line in retried
        ), output
    named = re.search(r" is in (\S+\.txt)$", lines[-1])
    assert named, lines[-1]
    text = Path(named[1]).read_text()
    assert "cannot connect to PostgreSQL" in text and "\tat org.apache.spark." in text
    assert Path(named[1]).parent == traces.resolve()


@pytest.mark.postgres
def test_a_task_failure_through_the_data_source_is_one_paragraph(
    postgres: Any, tmp_path: Path
) -> None:
    """Through ``format("txsink")`` no coordinator tells a failed task (Spark aborts the
    write, then ends the query on the task's error): the user's process prints the
    task's error as the paragraph (from its note), and Spark's records of the task
    (``Aborting task``, ``Aborting commit``, ``Exception in task``, ``Lost task``, the
    query's end) are not printed; Spark's two lines of the write's abort stay. The task
    raises by the fault plan (``TXSINK_FAULT``), at a known epoch."""
    schema = postgres.new_schema("para")
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {schema}.t (id bigint PRIMARY KEY, name text NOT NULL)")
    script = _DATASOURCE_JOB.format(columns=_NULL_COLUMNS, table=f"{schema}.t")
    script = script.replace("IF(value = 3, NULL, CONCAT('n', value))", "CONCAT('n', value)")
    env = {**postgres.env(), "TXSINK_FAULT": "before_precommit:raise@1"}
    env["TXSINK_FAULT_STATE"] = str(tmp_path / "faults")
    output, traces = _run(tmp_path, script, env)
    lines = [line for line in _lines(output) if not _DS_ABORT.search(line)]
    assert not [line for line in lines if _TASK_RECORDS.search(line)], output
    assert "Aborting task" not in output and "Aborting commit" not in output, output
    errors = [i for i, line in enumerate(lines) if "ERROR" in line or "Traceback" in line]
    first = lines[errors[0]]
    assert first.startswith("txsink: ERROR [orders epoch 1] InjectedFault: "), output
    assert "before_precommit" in first, first
    assert lines[errors[0] + 1 :] == lines[-1:], output
    assert lines[-1].startswith("txsink: the query stopped on this error"), output
    named = re.search(r" is in (\S+\.txt)$", lines[-1])
    assert named, lines[-1]
    assert Path(named[1]).parent == traces.resolve()
    assert "\tat org.apache.spark." in Path(named[1]).read_text()
