"""The Iceberg connector's tables read back by a second, independent reader: Spark with
Apache Iceberg's own Spark runtime through Iceberg's JDBC catalog on the same PostgreSQL
database and S3FileIO on the same MinIO server (``integration/iceberg_spark_reader.py``, in
``.venv-iceberg-spark``: no Iceberg runtime runs on txsink's PySpark 4.3, so that venv has
PySpark 4.1 and Spark fetches ``iceberg-spark-runtime-4.1_2.13``). Slow: make the venv with
``./dev iceberg-reader``, then ``pytest --run-slow integration/test_iceberg_second_reader.py``.
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
from txsink.connectors.iceberg.commit import epoch_key
from txsink.protocol.faults import FaultPlan
from txsink.testing.verifiers import verify

ROOT = Path(__file__).resolve().parent.parent
ROWS, FILES = 600, 3


def _reader() -> str:
    found = os.environ.get("TXSINK_ICEBERG_SPARK_PYTHON") or str(
        ROOT / ".venv-iceberg-spark" / "bin" / "python"
    )
    if not Path(found).exists():
        pytest.skip(
            "no PySpark 4.1 for Iceberg's Spark runtime: make .venv-iceberg-spark with "
            "./dev iceberg-reader"
        )
    return found


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "mode"), [("during_commit", "raise"), ("after_precommit", "kill-worker")]
)
def test_spark_with_icebergs_runtime_reads_every_row_once(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Path, point: str, mode: str
) -> None:
    python = _reader()
    target = variant_target(request, tmp_path, "iceberg", "sql-s3", tag="i2r")
    prepare_input(tmp_path, ROWS, FILES)
    plan = FaultPlan.parse(fault_spec(point, mode, 1), str(tmp_path / "faults"))
    log = str(tmp_path / "txlog")
    run_until_done(spark, tmp_path, lambda: Coordinator([target.sink()], log=log, faults=plan))
    assert plan.fired(), "the fault never fired: test is void"
    assert verify(target.verifier(range(ROWS), log=log)).ok
    spec = target.spec
    done = subprocess.run(
        [
            python,
            str(ROOT / "integration" / "iceberg_spark_reader.py"),
            spec["catalog_name"],
            spec["table"],
            spec["warehouse"],
        ],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env={**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(seen["ids"]) == list(range(ROWS))
    # one snapshot per committed epoch, none twice, each carrying txsink's summary
    apps = {s["summary"].get("txsink.app") for s in seen["snapshots"]}
    assert len(apps) == 1 and None not in apps, apps  # every snapshot is one of the query's
    app = apps.pop()
    ours = seen["snapshots"]
    assert sorted(int(s["summary"]["txsink.epoch"]) for s in ours) == list(range(FILES))
    assert seen["properties"][epoch_key(app, spec["uid"])] == str(FILES - 1)
