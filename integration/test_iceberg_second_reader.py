"""The Iceberg connector's tables read back by a second, independent reader: Spark with
Apache Iceberg's own Spark runtime through Iceberg's JDBC catalog on the same PostgreSQL
database and S3FileIO on the same MinIO server (``integration/iceberg_spark_reader.py`` in
a child process). On each matrix line (3.5 to 4.1) the reader runs in that line's venv with
its line's runtime (``iceberg-spark-runtime-3.5_2.12`` on 3.5, ...: ``spark_jars.py``); on
4.2 and txsink's 4.3, which no Iceberg runtime supports yet, in ``.venv-iceberg-spark``
(PySpark 4.1, ``./dev iceberg-reader``) or a matrix venv. Slow: ``pytest --run-slow
integration/test_iceberg_second_reader.py``; the matrix (``--matrix``) runs one cell per
line."""

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
from txsink.connectors.iceberg.commit import epoch_key
from txsink.protocol.faults import FaultPlan
from txsink.testing.verifiers import verify

ROOT = Path(__file__).resolve().parent.parent
ROWS, FILES = 600, 3


def _reader(record_property: Callable[[str, object], None]) -> spark_jars.Reader:
    found = spark_jars.iceberg_reader()
    if isinstance(found, str):
        pytest.skip(found)
    if found.elsewhere:
        record_property("matrix_note", found.elsewhere)
    return found


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "mode"),
    [
        pytest.param("during_commit", "raise", marks=pytest.mark.matrix("iceberg_reader")),
        ("after_precommit", "kill-worker"),
    ],
)
def test_spark_with_icebergs_runtime_reads_every_row_once(
    spark: Any,
    request: pytest.FixtureRequest,
    record_property: Callable[[str, object], None],
    tmp_path: Path,
    point: str,
    mode: str,
) -> None:
    reader = _reader(record_property)
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
            reader.python,
            str(ROOT / "integration" / "iceberg_spark_reader.py"),
            spec["catalog_name"],
            spec["table"],
            spec["warehouse"],
        ],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env={**os.environ, **reader.env},
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
