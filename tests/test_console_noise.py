"""Spark's console around txsink's lines, from real runs' stderr (a file, or a pipe).

- A user's session draws Spark's progress bar (``[Stage 0:> ... (0 + 1) / 1]``, ``\\r``
  updates, no newline): txsink's epoch lines still start lines of their own.
- A session txsink starts (:func:`txsink.spark.localspark.local_spark`, what the demo, chaos runs
  and ``txsink check`` run) prints no WARN line and no log-level banner.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from txsink.testing import make_input

SCHEMA = "id long, key string, amount double, payload string"

#: A user's job as README.md writes it, its session drawing the progress bar; a slow job
#: (2 s, the bar shows a stage after 0.5 s) before each epoch makes sure the bar draws.
JOB = f"""
import os, sys, time
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession
from txsink import Coordinator
from txsink.connectors.files import FilesSink

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.showConsoleProgress", "true")
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
coordinator = Coordinator([FilesSink("out", uid="events")], log="txlog")


def epoch(df, batch_id):
    spark.sparkContext.parallelize([0], 1).foreach(lambda _: time.sleep(2))
    coordinator(df, batch_id)


query = (
    spark.readStream.schema("{SCHEMA}").option("maxFilesPerTrigger", 1).parquet("input")
    .writeStream.foreachBatch(epoch).option("checkpointLocation", "checkpoint")
    .trigger(availableNow=True).start()
)
query.awaitTermination()
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXSINK_")}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def _stderr(cmd: list[str], cwd: Path, into: str) -> bytes:
    """The command's stderr, written into a file or a pipe as it runs."""
    if into == "file":
        path = cwd / "stderr.txt"
        with path.open("wb") as err:
            proc = subprocess.run(
                cmd,
                check=False,
                cwd=cwd,
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=err,
                timeout=300,
            )
        data = path.read_bytes()
    else:
        proc = subprocess.run(
            cmd,
            check=False,
            cwd=cwd,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=300,
        )
        data = proc.stderr
    assert proc.returncode == 0, data[-3000:].decode(errors="replace")
    return data


@pytest.mark.parametrize("into", ["file", "pipe"])
def test_epoch_lines_never_share_a_line_with_sparks_progress_bar(tmp_path: Path, into: str) -> None:
    make_input(str(tmp_path / "input"), rows=200, files=2)
    (tmp_path / "job.py").write_text(JOB)
    data = _stderr([sys.executable, "job.py"], tmp_path, into)
    lines = data.split(b"\n")
    assert any(b"[Stage" in line for line in lines), "the progress bar never drew"
    said = [line for line in lines if b"txsink:" in line]
    committed = [line for line in said if b"] committed: events 100 rows" in line]
    assert len(committed) == 2, data[-3000:]
    glued = [line for line in said if not line.startswith(b"txsink:") or b"\r" in line]
    assert not glued, glued


def test_a_session_txsink_starts_prints_no_warn_line(tmp_path: Path) -> None:
    make_input(str(tmp_path / "input"), rows=200, files=2)
    spec = {"workdir": str(tmp_path), "sinks": [{"kind": "files", "path": str(tmp_path / "o")}]}
    cmd = [sys.executable, "-m", "txsink.runner", "txsink.testing.pipelines:run_stream"]
    data = _stderr([*cmd, json.dumps(spec)], tmp_path, "file").decode(errors="replace")
    lines = data.splitlines()
    assert sum("] committed: " in line and " 100 rows" in line for line in lines) == 2, data[-3000:]
    warned = [line for line in lines if re.search(r"\bWARN\b", line)]
    assert not warned, warned
    assert not [line for line in lines if "Setting default log level" in line], data[-3000:]
    assert not [line for line in lines if "[Stage" in line], data[-3000:]
