"""The Delta connector's tables read back by a second, independent reader: Spark with Delta
Lake's own jar (``integration/delta_spark_reader.py``, in ``.venv-delta-spark``: no Delta
release runs on txsink's PySpark 4.3, so that venv has PySpark 4.2 and Spark fetches
``io.delta:delta-spark_2.13:4.4.0``). Slow: make the venv with ``./dev delta-reader``, then
``pytest --run-slow integration/test_delta_second_reader.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import variant_target
from tests.streaming import fault_spec, prepare_input, run_until_done
from txsink import Coordinator
from txsink.protocol.faults import FaultPlan
from txsink.testing.verifiers import verify

ROOT = Path(__file__).resolve().parent.parent
ROWS, FILES = 600, 3


def _reader() -> str:
    found = os.environ.get("TXSINK_DELTA_SPARK_PYTHON") or str(
        ROOT / ".venv-delta-spark" / "bin" / "python"
    )
    if not Path(found).exists():
        pytest.skip(
            "no PySpark 4.2 for Delta's jar: make .venv-delta-spark with ./dev delta-reader"
        )
    return found


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    ("variant", "point", "mode"),
    [("partitioned", "during_commit", "raise"), ("local", "after_precommit", "kill-worker")],
)
def test_spark_with_deltas_jar_reads_every_row_once(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Path, variant: str, point: str, mode: str
) -> None:
    python = _reader()
    target = variant_target(request, tmp_path, "delta", variant, tag="d2r")
    prepare_input(tmp_path, ROWS, FILES)
    plan = FaultPlan.parse(fault_spec(point, mode, 1), str(tmp_path / "faults"))
    log = str(tmp_path / "txlog")
    run_until_done(spark, tmp_path, lambda: Coordinator([target.sink()], log=log, faults=plan))
    assert plan.fired(), "the fault never fired: test is void"
    assert verify(target.verifier(range(ROWS), log=log)).ok
    done = subprocess.run(
        [python, str(ROOT / "integration" / "delta_spark_reader.py"), target.spec["table"]],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env={**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(seen["ids"]) == list(range(ROWS))
    writes = [op for _, op in seen["operations"] if op == "WRITE"]
    assert len(writes) == FILES  # one Delta commit per epoch, none twice
