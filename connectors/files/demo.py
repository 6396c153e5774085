"""``txsink demo``: exactly-once into local files, with an optional crash.

The parent process writes a deterministic input (Parquet files), then runs
the streaming query (:func:`txsink.testing.pipelines.run_stream` with one files
sink) in a child process under :mod:`txsink.runner`, which restarts it after
every crash and says why each run ended, and finally reads the output back
through the epoch manifests and prints one JSON line with the verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from txsink import CrashPoint, Fault, FaultMode, FaultPlan
from txsink.cli import Command
from txsink.runner import FATAL_EXIT
from txsink.testing.inputs import make_input

__all__ = ["COMMAND", "main", "run_demo"]


def fault_plan_for(crash: str | None) -> str:
    """The fault plan text for ``--crash``; ``during_recovery`` gets a crash to recover from."""
    if not crash:
        return ""
    if "," in crash:  # a full plan: taken as given
        return str(",".join(str(f) for f in FaultPlan.parse(crash).faults))
    fault = Fault.parse(crash)
    if fault.point is CrashPoint.DURING_RECOVERY:
        lead = Fault(
            CrashPoint.DURING_COMMIT,
            fault.mode if fault.mode is not FaultMode.KILL_WORKER else FaultMode.RAISE,
            epoch=fault.epoch,
        )
        return f"{lead},{fault}"
    return str(fault)


def run_demo(
    workdir: Path,
    *,
    rows: int,
    files: int,
    partitions: int,
    crash: str | None,
    fmt: str,
    max_runs: int,
    echo: bool = True,
    via: str = "foreachBatch",
) -> dict[str, Any]:
    from txsink.connectors.files.testing import verify_files
    from txsink.runner import python_module_cmd, run_until_done

    started = time.monotonic()
    shutil.rmtree(workdir, ignore_errors=True)
    make_input(workdir / "input", rows, files)
    plan = fault_plan_for(crash)
    env = dict(os.environ)
    env.pop("TXSINK_FAULT", None)
    if plan:
        env["TXSINK_FAULT"] = plan
        env["TXSINK_FAULT_STATE"] = str(workdir / "faults")

    def say(message: str) -> None:
        if echo:
            print(message, file=sys.stderr, flush=True)

    say(
        f"txsink demo: {rows} rows in {files} input files -> {workdir / 'output'}"
        + (f", injecting {plan}" if plan else "")
    )
    # The child is the generic pipeline every chaos run uses, with one files sink.
    spec = {"kind": "files", "path": str(workdir / "output"), "uid": "demo", "format": fmt}
    args: dict[str, Any] = {"workdir": str(workdir), "sinks": [spec], "partitions": partitions}
    pipeline = "txsink.testing.pipelines:run_stream"
    if via == "datasource":  # the same sink through writeStream.format("txsink")
        options = {"connector": "files", "path": spec["path"], "uid": "demo", "format": fmt}
        args = {"workdir": str(workdir), "options": options, "partitions": partitions}
        pipeline = "txsink.testing.pipelines:run_datasource"
    report = run_until_done(
        python_module_cmd("txsink.runner", pipeline, json.dumps(args)),
        env=env,
        max_runs=max_runs,
        say=lambda line: say(line if line.startswith("  ") else f"txsink demo: {line}"),
    )
    verdict = verify_files(workdir / "output", range(rows))
    fired = FaultPlan.parse(plan, str(workdir / "faults")).fired() if plan else []
    result: dict[str, Any] = {
        "rows_expected": verdict.rows_expected,
        "rows_written": verdict.rows_written,
        "duplicates": verdict.duplicates,
        "missing": verdict.missing,
        "unexpected": verdict.unexpected,
        "lingering": verdict.lingering,
        "epochs": verdict.epochs,
        "restarts": report.restarts,
        "finished": report.finished,
        "faults_fired": len(fired),
        "crash": plan or None,
        "seconds": round(time.monotonic() - started, 1),
        "output": str(workdir / "output"),
        "ok": verdict.ok and report.finished,
    }
    if report.fatal:  # ended on an error a restart cannot help: not restarted; which one
        result["error"] = report.failure or report.endings[-1]
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=100_000, help="input rows (default 100000)")
    parser.add_argument(
        "--files", type=int, default=8, help="input files; one epoch per file (default 8)"
    )
    parser.add_argument("--partitions", type=int, default=2, help="Spark partitions (default 2)")
    parser.add_argument(
        "--crash",
        metavar="POINT[:MODE]",
        default=None,
        help="inject a fault, e.g. after_decision:kill-driver; several comma-separated "
        "(POINT[:MODE][@EPOCH][#PARTITION][*TIMES])",
    )
    parser.add_argument("--format", default="parquet", choices=["parquet", "jsonl", "csv"])
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(".txsink-demo"),
        help="input, output, txsink log and checkpoint (default .txsink-demo)",
    )
    parser.add_argument("--max-runs", type=int, default=10, help="give up after this many runs")
    parser.add_argument(
        "--via",
        choices=["foreachBatch", "datasource"],
        default="foreachBatch",
        help="the query's entry point: foreachBatch(Coordinator) (default) or the Data Source "
        'writeStream.format("txsink")',
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="txsink demo", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return demo_command(args)


def demo_command(args: argparse.Namespace) -> int:
    if args.crash:
        try:
            fault_plan_for(args.crash)
        except ValueError as err:
            print(f"txsink demo: --crash: {err}", file=sys.stderr)
            return 2
    result = run_demo(
        args.workdir.resolve(),
        rows=args.rows,
        files=args.files,
        partitions=args.partitions,
        crash=args.crash,
        fmt=args.format,
        max_runs=args.max_runs,
        via=args.via,
    )
    print(json.dumps(result), flush=True)
    if result.get("error"):
        return FATAL_EXIT  # the query's own error stopped it: its exit code, not a verdict
    return 0 if result["ok"] else 1


#: ``txsink demo``, registered by the files connector.
COMMAND = Command("run the exactly-once demo on local files", add_arguments, demo_command)

if __name__ == "__main__":
    sys.exit(main())
