"""``txsink recover`` and ``txsink abort``: recovery by hand, over the pipeline's own sinks.

``--pipeline FILE.py:FUNC`` names the function that builds the pipeline's
coordinator (or sinks), so the commands reach the targets with the pipeline's
uids, settings and credentials (:mod:`txsink.cli.pipeline`). Each prints one line per
action ("would commit ..." with ``--dry-run``, "committed ..." without) and a
summary, and exits 0, or 1 with the error's message.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from txsink.cli import log_location_help
from txsink.cli.pipeline import load_coordinator
from txsink.errors import TxsinkError
from txsink.protocol.recovery import ActionKind, RecoveryAction

__all__ = [
    "abort_command",
    "add_abort_arguments",
    "add_recover_arguments",
    "recover_command",
]


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", required=True, help=log_location_help())
    parser.add_argument(
        "--pipeline",
        required=True,
        metavar="FILE.py:FUNC",
        help="function returning the pipeline's Coordinator (or sinks), configured as it runs",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument(
        "--break-lease",
        "--force",
        dest="break_lease",
        action="store_true",
        help="take the driver lease even though a driver holds it: only when that driver "
        "is known dead (its host is gone); a live one would be fenced",
    )


def add_recover_arguments(parser: argparse.ArgumentParser) -> None:
    """``txsink recover``: commit decided epochs, abort lingering undecided transactions."""
    _add_common(parser)


def add_abort_arguments(parser: argparse.ArgumentParser) -> None:
    """``txsink abort``: abort lingering undecided transactions; never a decided epoch."""
    _add_common(parser)
    parser.add_argument(
        "--epoch", type=int, default=None, help="only this epoch's transactions (default: all)"
    )


def recover_command(args: argparse.Namespace) -> int:
    return _run("recover", args)


def abort_command(args: argparse.Namespace) -> int:
    return _run("abort", args)


def _run(command: str, args: argparse.Namespace) -> int:
    dry_run = bool(args.dry_run)
    try:
        coordinator = load_coordinator(args.pipeline, args.log)
        if command == "recover":
            actions = coordinator.recover(dry_run=dry_run, break_lease=args.break_lease)
        else:
            actions = coordinator.abort(
                epoch=args.epoch, dry_run=dry_run, break_lease=args.break_lease
            )
    except TxsinkError as err:
        print(f"txsink {command}: {err}", file=sys.stderr)
        return 1
    for action in actions:
        print(action.describe(done=not dry_run))
    print(_summary(command, actions, dry_run))
    return 0


def _summary(command: str, actions: list[RecoveryAction], dry_run: bool) -> str:
    if not actions:
        return f"txsink {command}: nothing to do"
    counts = Counter(action.kind for action in actions)
    commits = sum(len(a.handles) for a in actions if a.kind is ActionKind.COMMIT)
    aborts = sum(
        counts[k]
        for k in (ActionKind.ABORT, ActionKind.ABORT_PRUNED, ActionKind.ABORT_NOT_RESTORED)
    )
    would = "would " if dry_run else ""
    parts = [
        f"{would}commit {commits} transaction(s)"
        if dry_run
        else f"committed {commits} transaction(s)",
        f"{would}abort {aborts}" if dry_run else f"aborted {aborts}",
        f"{would}void {counts[ActionKind.VOID]} round(s)"
        if dry_run
        else f"voided {counts[ActionKind.VOID]} round(s)",
        f"{would}finish {counts[ActionKind.MARK_COMMITTED]} decided epoch(s)"
        if dry_run
        else f"finished {counts[ActionKind.MARK_COMMITTED]} decided epoch(s)",
    ]
    if counts[ActionKind.SKIP_NOT_RESTORED]:
        parts.append(f"{counts[ActionKind.SKIP_NOT_RESTORED]} sink share(s) not restored")
    head = f"txsink {command}{' (dry run: nothing changed)' if dry_run else ''}"
    return f"{head}: {', '.join(parts)}"
