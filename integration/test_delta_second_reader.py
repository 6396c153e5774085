"""The Delta connector's tables read back by a second, independent reader: Spark with Delta
Lake's own jar (``integration/delta_spark_reader.py`` in a child process). On each matrix
line (3.5 to 4.2) the reader runs in that line's venv with its line's Delta release
(``delta-spark_2.12:3.3.3`` on 3.5, ...: ``spark_jars.py``); on txsink's 4.3, which no
Delta release supports yet, in ``.venv-delta-spark`` (PySpark 4.2, ``./dev delta-reader``)
or a matrix venv. Slow: ``pytest --run-slow integration/test_delta_second_reader.py``; the
matrix (``--matrix``) runs one cell per line."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import spark_jars

from conftest import variant_target
from tests.streaming import fault_spec, prepare_input, run_until_done
from txsink import Coordinator
from txsink.protocol.faults import FaultPlan
from txsink.testing.verifiers import verify

ROOT = Path(__file__).resolve().parent.parent
ROWS, FILES = 600, 3


def _reader(record_property: Callable[[str, object], None]) -> spark_jars.Reader:
    found = spark_jars.delta_reader()
    if isinstance(found, str):
        pytest.skip(found)
    if found.elsewhere:
        record_property("matrix_note", found.elsewhere)
    return found


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    ("variant", "point", "mode"),
    [
        ("partitioned", "during_commit", "raise"),
        pytest.param(
            "local", "after_precommit", "kill-worker", marks=pytest.mark.matrix("delta_reader")
        ),
    ],
)
def test_spark_with_deltas_jar_reads_every_row_once(
    spark: Any,
    request: pytest.FixtureRequest,
    record_property: Callable[[str, object], None],
    tmp_path: Path,
    variant: str,
    point: str,
    mode: str,
) -> None:
    reader = _reader(record_property)
    target = variant_target(request, tmp_path, "delta", variant, tag="d2r")
    prepare_input(tmp_path, ROWS, FILES)
    plan = FaultPlan.parse(fault_spec(point, mode, 1), str(tmp_path / "faults"))
    log = str(tmp_path / "txlog")
    run_until_done(spark, tmp_path, lambda: Coordinator([target.sink()], log=log, faults=plan))
    assert plan.fired(), "the fault never fired: test is void"
    assert verify(target.verifier(range(ROWS), log=log)).ok
    done = subprocess.run(
        [reader.python, str(ROOT / "integration" / "delta_spark_reader.py"), target.spec["table"]],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env={**os.environ, **reader.env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(seen["ids"]) == list(range(ROWS))
    writes = [op for _, op in seen["operations"] if op == "WRITE"]
    assert len(writes) == FILES  # one Delta commit per epoch, none twice
