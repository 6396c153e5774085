"""Regenerate ``docs/images/inspect-report.png``, the screenshot in ``docs/inspect.md``.

Run from the repository root (about a minute; needs Debian's ``chromium`` package)::

    ./.venv/bin/python docs/images/make_inspect_screenshot.py

It streams 6 epochs into two files sinks in a local Spark session, with a driver crash
right after epoch 2's decision (the restart's recovery commits it) and a pre-commit that
fails twice in epoch 4 (that round is voided; the restart's round commits), then renders
the report of that log and screenshots it in headless Chromium at 1280 px wide.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA = "id long, key string, amount double, payload string"


def build_log(workdir: Path) -> Path:
    """A realistic txsink log under ``workdir``: 6 epochs, one crash, one aborted round."""
    from pyspark.errors import StreamingQueryException

    from txsink import Coordinator, FaultPlan
    from txsink.connectors.files import FilesSink
    from txsink.spark.localspark import local_spark
    from txsink.testing.inputs import make_input

    spark = local_spark("local[2,2]", "txsink-docs")
    try:
        make_input(workdir / "input", 6000, 6)
        plan = FaultPlan.parse(
            "after_decision:raise@2,before_precommit:raise@4#1*2", str(workdir / "faults")
        )
        for _run in range(4):
            coordinator = Coordinator(
                [
                    FilesSink(workdir / "orders", uid="orders"),
                    FilesSink(workdir / "audit", uid="audit", format="jsonl"),
                ],
                log=str(workdir / "txlog"),
                faults=plan,
            )
            df = (
                spark.readStream.schema(SCHEMA)
                .option("maxFilesPerTrigger", 1)
                .parquet(str(workdir / "input"))
                .repartition(3)
            )
            query: Any = (
                df.writeStream.foreachBatch(coordinator)
                .option("checkpointLocation", str(workdir / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            try:
                query.awaitTermination()
                break
            except StreamingQueryException:
                continue  # a supervisor restarts the query
    finally:
        spark.stop()
    return workdir / "txlog"


def screenshot(page: Path, png: Path, height: int) -> None:
    sys.path.insert(0, str(HERE.parent.parent))  # the repository root, for tests.chromium
    from tests.chromium import run_chromium

    profile = Path(tempfile.mkdtemp(prefix="txsink-chromium-"))
    run_chromium([f"--screenshot={png}", f"--window-size=1280,{height}", page.as_uri()], profile)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "inspect-report.png"))
    parser.add_argument("--height", type=int, default=1800, help="window height in pixels")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from txsink.ops.report import render_report

    with tempfile.TemporaryDirectory(prefix="txsink-docs-") as tmp:
        log = build_log(Path(tmp))
        page = Path(tmp) / "report.html"
        page.write_text(render_report(log, title="txsink log: orders pipeline"))
        screenshot(page, Path(args.out), args.height)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
