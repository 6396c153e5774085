"""``txsink inspect``: write the HTML report of a txsink log (and optionally its table as CSV).

Reading the log needs nothing but the log. Lingering transactions live in the targets, so
listing them needs the sinks, configured as in the pipeline: ``--pipeline FILE.py:FUNC``
imports the pipeline's own factory (see :mod:`txsink.cli.pipeline`). Listing is read-only:
this command never commits, aborts or writes anything but its own output files.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from txsink.cli import log_location_help
from txsink.errors import ConfigurationError, TxsinkError
from txsink.ops.inspect import LogSnapshot, epoch_table, log_table, read_log
from txsink.ops.report import render_report
from txsink.protocol.log import open_log

__all__ = ["add_arguments", "inspect_command", "list_lingering"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``txsink inspect``."""
    parser.add_argument("--log", required=True, help=log_location_help())
    parser.add_argument(
        "--out",
        default="txsink-report.html",
        help="where to write the HTML report (default: %(default)s)",
    )
    parser.add_argument("--csv", help="also write the per-handle table (log_table) as CSV")
    parser.add_argument("--title", help="the report's title (default: the app id)")
    parser.add_argument(
        "--pipeline",
        metavar="FILE.py:FUNC",
        help="the pipeline's sink factory, to list lingering prepared transactions in the "
        "targets (read-only)",
    )
    parser.add_argument(
        "--audit",
        choices=["metadata", "deep"],
        help="with --pipeline: audit the committed epochs in the targets (txsink audit) and "
        "add the Audit section",
    )


def inspect_command(args: argparse.Namespace) -> int:
    """Run ``txsink inspect``; 0 on success, 1 if there is no log at ``--log``."""
    log = open_log(args.log)
    if log.meta() is None:
        print(f"txsink inspect: no txsink log at {args.log}", file=sys.stderr)
        return 1
    snap = read_log(log)
    lingering = list_lingering(snap, args.pipeline) if args.pipeline else None
    audit = None
    if args.audit:
        if not args.pipeline:
            print("txsink inspect: --audit needs --pipeline (the sinks)", file=sys.stderr)
            return 1
        from txsink.cli.pipeline import load_sinks
        from txsink.ops.audit import audit_log

        audit = audit_log(log, load_sinks(args.pipeline), deep=args.audit == "deep")
    out = Path(args.out)
    _write(out, render_report(snap, title=args.title, lingering=lingering, audit=audit))
    print(f"txsink inspect: report written to {out.resolve()}")
    if args.csv:
        csv = Path(args.csv)
        csv.parent.mkdir(parents=True, exist_ok=True)
        log_table(snap).to_csv(csv, index=False, date_format="%Y-%m-%dT%H:%M:%S.%fZ")
        print(f"txsink inspect: table written to {csv.resolve()}")
    print(_summary(snap, lingering))
    if audit is not None:
        from txsink.ops.audit.table import summary_line

        print(f"txsink inspect: {summary_line(audit)}")
    return 0


def list_lingering(snap: LogSnapshot, spec: str) -> dict[str, list[str]]:
    """Sink uid -> prepared transactions of the log's app that no decision names.

    Calls each sink's ``list_prepared`` (read-only). Raises a
    :class:`~txsink.errors.TxsinkError` naming the sink if a target cannot be listed.
    """
    from txsink.cli.pipeline import load_sinks

    decided = snap.decided_txns()
    out: dict[str, list[str]] = {}
    for sink in load_sinks(spec):
        try:
            names = sorted(str(h.txn) for h in sink.list_prepared(snap.app_id))
        except TxsinkError as err:
            raise err.with_context(sink_uid=sink.uid, phase="inspect") from None
        except Exception as err:
            first = (str(err).strip().splitlines() or [""])[0]
            raise ConfigurationError(
                f"txsink inspect: listing the prepared transactions of sink {sink.uid} failed "
                f"({type(err).__name__}: {first[:300]}); check that its target is reachable "
                f"with the settings {spec} gives it",
                sink_uid=sink.uid,
                phase="inspect",
                connector=sink.connector,
            ) from err
        out[sink.uid] = [n for n in names if n not in decided]
    return out


def _summary(snap: LogSnapshot, lingering: Mapping[str, Sequence[str]] | None) -> str:
    epochs = epoch_table(snap)
    counts: Mapping[Any, int] = epochs["status"].value_counts().to_dict()
    parts = [
        f"{len(epochs)} epochs: {counts.get('committed', 0)} committed, "
        f"{counts.get('decided', 0)} decided and pending, {counts.get('aborted', 0)} aborted, "
        f"{counts.get('open', 0)} open",
        f"{int(epochs['voided_rounds'].sum())} voided rounds",
    ]
    if lingering is None:
        parts.append("lingering transactions not checked (pass --pipeline)")
    else:
        parts.append(f"{sum(len(v) for v in lingering.values())} lingering transactions")
    return f"txsink log {snap.location} app {snap.app_id}: " + "; ".join(parts)


def _write(path: Path, text: str) -> None:
    """Write ``text`` whole: a temporary file renamed into place, so a browser that
    reloads the report never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
