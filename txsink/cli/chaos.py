"""``txsink chaos run`` and ``txsink chaos soak``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from txsink.protocol.faults import CrashPoint, FaultMode

_MARKER = ".txsink-chaos"


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="chaos_command", required=True)
    run = sub.add_parser(
        "run",
        help="run a pipeline under a fault plan until done, and verify its sinks",
        description="Run a pipeline (FILE.py:FUNC or MODULE:FUNC, one query to the end of its "
        "input) in a child process under a fault plan, restarting it after every crash; then "
        "read every sink back. Without --pipeline, runs the built-in pipeline (a file stream "
        "into a fresh target of each --connectors) on a generated input.",
    )
    run.add_argument("--pipeline", help="FILE.py:FUNC or MODULE:FUNC (default: built-in)")
    run.add_argument("--args", default="{}", help="the pipeline's keyword arguments, as JSON")
    which = run.add_mutually_exclusive_group()
    which.add_argument("--plan", help="a fault spec: POINT[:MODE][@EPOCH][#PARTITION][*TIMES],...")
    which.add_argument("--seed", type=int, help="draw a random plan with this seed")
    _plan_options(run)
    run.add_argument(
        "--connectors",
        type=_csv,
        help="built-in pipeline: connectors to write to (default: those that need no server)",
    )
    run.add_argument(
        "--sink",
        action="append",
        default=[],
        metavar="SPEC",
        help='verify a sink given as a JSON spec, e.g. \'{"kind": "files", "path": "out", '
        '"uid": "out"}\' (repeatable; needs --expect-ids)',
    )
    run.add_argument(
        "--expect-ids", type=int, metavar="N", help="the input holds ids 0..N-1 (for --sink)"
    )
    run.add_argument(
        "--verifiers",
        metavar="FILE.py:FUNC",
        help="a function called with the pipeline's args dict, returning {name: verifier}",
    )
    run.add_argument("--rows", type=int, default=600, help="built-in pipeline: input rows")
    run.add_argument(
        "--workdir", type=Path, default=Path(".txsink-chaos"), help="fault state, built-in data"
    )
    run.add_argument("--max-runs", type=int, default=10, help="give up after this many runs")
    run.add_argument("--json", action="store_true", help="print the report as one JSON line")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    _target_options(run)

    soak = sub.add_parser(
        "soak",
        help="run N random fault plans across connectors; a tally per plan and a final table",
        description="Run N random fault plans, each on a fresh input, into every selected "
        "connector at once. Connectors that need no server are always available; the others "
        "when the environment names their server (docs/testing-recovery.md lists them).",
    )
    _tally_parser(sub)
    soak.add_argument("--plans", type=int, default=5, help="how many plans (default 5)")
    soak.add_argument("--seed", type=int, default=0, help="the soak's seed (default 0)")
    soak.add_argument(
        "--connectors",
        type=_csv,
        help="comma-separated (default: every registered connector whose server is set)",
    )
    _plan_options(soak)
    soak.add_argument("--rows", type=int, default=600, help="input rows per plan (default 600)")
    soak.add_argument(
        "--workdir", type=Path, default=Path(".txsink-soak"), help="one folder per plan under it"
    )
    soak.add_argument("--max-runs", type=int, default=10, help="per plan")
    soak.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="plans run at once (default 1; results do not depend on it)",
    )
    _target_options(soak)
    soak.add_argument(
        "--timer-kills",
        type=float,
        default=0.0,
        help="chance that a plan also kills a server at a random moment (default 0)",
    )
    soak.add_argument(
        "--two-drivers",
        type=float,
        default=0.0,
        help="chance that a plan, instead of a fault, starts a second driver of the running "
        "query: it must be refused, the first must finish undisturbed (default 0)",
    )
    soak.add_argument(
        "--poison",
        type=float,
        default=0.0,
        help="chance that a plan, instead of a fault, puts a record a target refuses into "
        "one input epoch: refused before the decision, then fixed and resumed (default 0)",
    )
    soak.add_argument(
        "--results",
        type=Path,
        help="append each plan to this JSON-lines file and resume from it: plans already in "
        "it are not run again (see `txsink chaos tally`)",
    )
    soak.add_argument(
        "--prune", action="store_true", help="delete the folders of plans that passed"
    )
    soak.add_argument("--json", action="store_true", help="print every report as JSON at the end")
    soak.add_argument("--verbose", action="store_true", help="show the children's txsink lines")


def _target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--targets",
        metavar="MODULE:FUNCTION",
        help="a function returning {name: control} of the target servers kill-target faults "
        "may SIGKILL (txsink.testing.TargetControl; see docs/fault-injection.md)",
    )
    parser.add_argument(
        "--down", type=float, default=2.0, help="seconds a killed server stays down (default 2)"
    )


def _tally_parser(sub: Any) -> None:
    tally = sub.add_parser(
        "tally",
        help="the tables of a soak's results file (every run appended to it)",
        description="Tally a results file of `txsink chaos soak --results`: totals, fault "
        "modes, servers killed, as Markdown tables.",
    )
    tally.add_argument("results", type=Path)


def _plan_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the input (default 3)")
    parser.add_argument("--partitions", type=int, default=2, help="Spark partitions (default 2)")
    parser.add_argument("--faults", type=int, default=1, help="random faults per plan (default 1)")
    parser.add_argument(
        "--points",
        type=_csv,
        default=[str(p) for p in CrashPoint],
        help="crash points to draw from (default: all)",
    )
    parser.add_argument(
        "--modes",
        type=_csv,
        default=[str(FaultMode.RAISE), str(FaultMode.KILL_DRIVER)],
        help="modes to draw from (default: raise,kill-driver)",
    )
    parser.add_argument(
        "--probability", type=float, default=1.0, help="keep each drawn fault with this chance"
    )


def _say(enabled: bool) -> Any:
    def say(line: str) -> None:
        if enabled:
            print(line, file=sys.stderr, flush=True)

    return say


def _fresh(folder: Path) -> None:
    """Use ``folder`` for generated data: new, empty, or one of ours (then emptied)."""
    import shutil

    if folder.exists() and any(folder.iterdir()):
        if not (folder / _MARKER).exists():
            raise ValueError(f"--workdir {folder} is not empty and not a txsink chaos folder")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / _MARKER).write_text("created by txsink chaos; deleted by its next run\n")


def run_command(args: argparse.Namespace) -> int:
    from txsink.testing import ChaosPlan, SinkVerifier, run_chaos
    from txsink.testing.adapter import adapter, adapters
    from txsink.testing.targets import child_env, new_targets

    workdir = args.workdir.resolve()
    controls = _targets(args.targets)
    if args.seed is not None:
        plan = ChaosPlan.random(
            args.seed,
            args.epochs,
            args.partitions,
            points=args.points,
            modes=args.modes,
            n=args.faults,
            probability=args.probability,
            targets=sorted(controls or {}),
        )
    else:
        plan = ChaosPlan.parse(args.plan or "")
    verifiers: dict[str, SinkVerifier] = {}
    env: dict[str, str] = {}
    if args.pipeline is None:
        from txsink.testing.inputs import make_input

        _fresh(workdir)
        make_input(workdir / "input", args.rows, args.epochs)
        pipeline = "txsink.testing.pipelines:run_stream"
        names = args.connectors or [
            name for name, found in adapters().items() if not found.env_vars
        ]
        targets = new_targets(names, workdir, tag="chaos")
        kwargs: dict[str, Any] = {
            "workdir": str(workdir),
            "sinks": [t.spec for t in targets],
            "partitions": args.partitions,
        }
        log = str(workdir / "txlog")
        verifiers.update({t.connector: t.verifier(range(args.rows), log=log) for t in targets})
        env = child_env(targets)
    else:
        pipeline = args.pipeline
        kwargs = json.loads(args.args)
        if not isinstance(kwargs, dict):
            raise ValueError("--args must be a JSON object")
        workdir.mkdir(parents=True, exist_ok=True)
    for item in args.sink:
        if args.expect_ids is None:
            raise ValueError("--sink needs --expect-ids N")
        spec = json.loads(item)
        if not isinstance(spec, dict) or "kind" not in spec:
            raise ValueError(f'--sink {item!r}: give a JSON object with "kind" and the target')
        verifiers[f"{spec['kind']}:{spec.get('uid', '')}"] = adapter(str(spec["kind"])).verifier(
            spec, range(args.expect_ids), os.environ
        )
    if args.verifiers:
        from txsink.runner import load_callable

        made = load_callable(args.verifiers)(kwargs)
        if not isinstance(made, dict):
            raise TypeError(f"{args.verifiers} must return a dict of name -> verifier")
        verifiers.update(made)
    if not verifiers:
        raise ValueError("nothing to verify: give --sink SPEC --expect-ids N or --verifiers")
    report = run_chaos(
        pipeline,
        plan,
        workdir=workdir,
        sinks_verifiers=verifiers,
        args=kwargs,
        env=env,
        max_runs=args.max_runs,
        on_progress=_say(not args.quiet),
        targets=controls,
        down_s=args.down,
    )
    print(json.dumps(report.as_dict()) if args.json else report.table(), flush=True)
    return 0 if report.ok else 1


def soak_command(args: argparse.Namespace) -> int:
    from txsink.testing.chaos import ChaosReport
    from txsink.testing.chaos.soak import SoakResult, available_connectors, soak

    connectors = args.connectors or available_connectors()
    folder = args.workdir.resolve() / f"seed-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True)
    print(
        f"txsink chaos soak: {args.plans} plan(s), seed {args.seed}, connectors "
        f"{','.join(connectors)}, {args.epochs} epochs x {args.rows} rows, in {folder}",
        flush=True,
    )

    def on_plan(index: int, report: ChaosReport, result: SoakResult) -> None:
        rec = "-" if report.recovery_max is None else f"{report.recovery_max:.1f}s"
        bad = "" if report.ok else "  <-- FAIL\n" + report.table()
        print(
            f"[{len(result.reports)}/{args.plans}] plan {index} seed {report.seed} "
            f"{report.plan or report.disturbance or '(no faults)'}: "
            f"{'ok' if report.ok else 'FAIL'}, {report.restarts} restart(s), fired "
            f"{len(report.faults_fired)}/{report.faults_planned}, recovery {rec} "
            f"| {result.tally()}{bad}",
            flush=True,
        )

    result = soak(
        args.plans,
        args.seed,
        workdir=folder,
        connectors=connectors,
        epochs=args.epochs,
        rows=args.rows,
        partitions=args.partitions,
        faults_per_plan=args.faults,
        points=args.points,
        modes=args.modes,
        probability=args.probability,
        max_runs=args.max_runs,
        jobs=args.jobs,
        on_progress=_say(args.verbose),
        on_plan=on_plan,
        targets=_targets(args.targets),
        down_s=args.down,
        timer_kills=args.timer_kills,
        results=args.results,
        prune=args.prune,
        two_drivers=args.two_drivers,
        poison=args.poison,
    )
    print(result.table(), flush=True)
    if args.json:
        print(json.dumps([r.as_dict() for r in result.reports]), flush=True)
    return 0 if result.ok else 1


def _targets(spec: str | None) -> dict[str, Any] | None:
    """The target servers' controls, from ``--targets MODULE:FUNCTION``."""
    if spec is None:
        return None
    from txsink.runner import load_callable
    from txsink.testing.chaos.targetcrash import TargetControl

    made = load_callable(spec)()
    if not isinstance(made, dict) or not all(isinstance(c, TargetControl) for c in made.values()):
        raise TypeError(f"--targets {spec} must return a dict of name -> TargetControl")
    return made


def chaos_command(args: argparse.Namespace) -> int:
    from txsink.spark.jvmcds import ensure_archive

    # Every query run starts a driver: build the class-data archive once (~45 s the first
    # time on a machine) to start each of them ~5 s faster.
    if args.chaos_command == "tally":
        from txsink.testing.chaos.soaklog import summary

        print(summary(args.results))
        return 0
    ensure_archive()
    try:
        if args.chaos_command == "run":
            return run_command(args)
        return soak_command(args)
    except (ValueError, TypeError) as err:
        print(f"txsink chaos {args.chaos_command}: {err}", file=sys.stderr)
        return 2
