"""The ``txsink savepoint`` and ``txsink state`` commands (wired into :mod:`txsink.cli`).

::

    txsink savepoint create  --log LOG --to DEST [--checkpoint DIR]
    txsink savepoint restore --from SP --log LOG [--checkpoint DIR]
    txsink state rename-uid  --log LOG --from OLD --to NEW [--dry-run] [--pipeline FILE.py:FUNC]

Each prints what it did (or would do) in plain lines and returns 0, or raises a
:class:`~txsink.errors.TxsinkError` that the CLI prints with its fix.
"""

from __future__ import annotations

import argparse
import datetime as dt

from txsink.cli import log_location_help

__all__ = [
    "add_savepoint_arguments",
    "add_state_arguments",
    "savepoint_command",
    "state_command",
]


def add_savepoint_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="savepoint_command", required=True)
    create = sub.add_parser(
        "create", help="copy the txsink log (and the Spark checkpoint) at a committed epoch"
    )
    create.add_argument("--log", required=True, help=log_location_help())
    create.add_argument(
        "--to", required=True, help=log_location_help("an empty location for the savepoint")
    )
    create.add_argument(
        "--checkpoint", help="the query's Spark checkpoint directory (local), copied along"
    )
    restore = sub.add_parser("restore", help="restore a savepoint into an empty log location")
    restore.add_argument(
        "--from", "--from-savepoint", dest="savepoint", required=True, help="the savepoint"
    )
    restore.add_argument("--log", required=True, help="an empty log location to restore into")
    restore.add_argument(
        "--checkpoint", help="an empty directory to restore the Spark checkpoint copy into"
    )


def savepoint_command(args: argparse.Namespace) -> int:
    from txsink.ops.savepoint import create_savepoint, restore_savepoint

    if args.savepoint_command == "create":
        sp = create_savepoint(args.log, args.to, checkpoint=args.checkpoint)
        print(f"savepoint {sp.location}")
        print(f"  app {sp.app_id}, last committed epoch {sp.last_committed}")
        print(f"  {len(sp.epochs)} committed epoch(s) {_span(sp.epochs)}, sinks {list(sp.sinks)}")
        print(f"  {len(sp.records)} log record(s) from {args.log}")
        if sp.has_checkpoint:
            ckpt = sp.manifest["checkpoint"]
            print(
                f"  Spark checkpoint {ckpt['source']}: {len(sp.checkpoint_files)} file(s), "
                f"query {ckpt['query_id']}, resumes at batch {ckpt['next_batch']}"
            )
        else:
            print("  no Spark checkpoint copied (copy it yourself while the query is stopped)")
        return 0
    report = restore_savepoint(args.savepoint, args.log, checkpoint=args.checkpoint)
    if report.already:
        print(f"log {report.log} already holds savepoint {args.savepoint}: nothing to do")
    else:
        print(f"restored {report.records_written} record(s) of {args.savepoint} into {report.log}")
    print(f"  app {report.app_id}, last committed epoch {report.last_committed}")
    if report.checkpoint is not None:
        print(f"  Spark checkpoint: {report.checkpoint_files} file(s) into {report.checkpoint}")
    nxt = 0 if report.last_committed is None else report.last_committed + 1
    print(
        f"  start the query with this log and the restored checkpoint: it continues at epoch {nxt}"
    )
    return 0


def add_state_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="state_command", required=True)
    rename = sub.add_parser("rename-uid", help="rename a sink uid in the log and its target")
    rename.add_argument("--log", required=True, help=log_location_help())
    rename.add_argument("--from", dest="old", required=True, help="the current uid")
    rename.add_argument("--to", dest="new", required=True, help="the new uid")
    rename.add_argument("--dry-run", action="store_true", help="print what would change")
    rename.add_argument(
        "--pipeline",
        help="FILE.py:FUNC returning the sinks configured with the NEW uid, to migrate the "
        "target too",
    )


def state_command(args: argparse.Namespace) -> int:
    from txsink.cli.pipeline import load_sinks
    from txsink.ops.state import rename_uid

    sinks = load_sinks(args.pipeline) if args.pipeline else []
    report = rename_uid(args.log, args.old, args.new, dry_run=args.dry_run, sinks=sinks)
    head = "dry run: would rename" if report.dry_run else "renamed"
    resumed = " (finished an interrupted rename)" if report.resumed else ""
    print(f"{head} sink uid {report.old!r} to {report.new!r} in {report.log}{resumed}")
    for line in report.actions:
        print(f"  {line}")
    if not report.dry_run:
        print(
            f"  done at {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%S} UTC: start the pipeline "
            f"with uid {report.new!r}"
        )
    return 0


def _span(epochs: tuple[int, ...]) -> str:
    if not epochs:
        return ""
    return f"{epochs[0]}..{epochs[-1]}" if len(epochs) > 1 else str(epochs[0])
