"""``txsink audit``: prove, epoch by epoch, that the targets hold what the log decided.

``--pipeline FILE.py:FUNC`` names the function that builds the pipeline's coordinator (or
sinks), so the audit reaches the targets with the pipeline's uids, settings and credentials
(:mod:`txsink.cli.pipeline`). Read-only. Exit status: 0 only if every epoch x sink matches
and no extra of ours is found; 1 otherwise (a mismatch, a sink that could not be audited, an
error).
"""

from __future__ import annotations

import argparse
import json
import sys

from txsink.cli import log_location_help
from txsink.cli.pipeline import load_sinks
from txsink.ops.audit import audit_log
from txsink.ops.audit.table import render_text
from txsink.protocol.log import open_log

__all__ = ["add_arguments", "audit_command"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``txsink audit``."""
    parser.add_argument("--log", required=True, help=log_location_help())
    parser.add_argument(
        "--pipeline",
        required=True,
        metavar="FILE.py:FUNC",
        help="function returning the pipeline's Coordinator (or sinks), configured as it runs",
    )
    span = parser.add_mutually_exclusive_group()
    span.add_argument("--since", type=int, metavar="E", help="audit committed epochs >= E")
    span.add_argument("--last", type=int, metavar="N", help="audit the last N committed epochs")
    parser.add_argument(
        "--deep",
        action="store_true",
        help="read the epochs' rows and compare their checksums (default: the targets' "
        "metadata: counts, files, snapshots, offsets)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--mismatches-only", action="store_true", help="list only the rows that do not match"
    )


def audit_command(args: argparse.Namespace) -> int:
    """Run ``txsink audit``; 0 only if everything matches."""
    if args.last is not None and args.last < 1:
        print("txsink audit: --last must be 1 or more", file=sys.stderr)
        return 1
    log = open_log(args.log)
    report = audit_log(
        log, load_sinks(args.pipeline), since=args.since, last=args.last, deep=args.deep
    )
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_text(report, all_rows=not args.mismatches_only))
    return 0 if report.ok else 1
