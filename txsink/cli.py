"""The ``txsink`` command line: ``demo``, ``status``, ``inspect``, ``chaos``, and the
operator commands ``savepoint``, ``state``, ``recover`` and ``abort``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable
from typing import Any

from txsink import _cli_inspect, _cli_operate, _cli_state, demo
from txsink.errors import TxsinkError
from txsink.log import EpochState, open_log
from txsink.testing import _cli as chaos_cli

__all__ = ["main"]


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _state_doc(state: EpochState) -> dict[str, Any]:
    dec = state.decision
    return {
        "epoch": state.epoch,
        "status": state.status,
        "rounds": list(state.rounds),
        "voided_rounds": list(state.voided),
        "decided_round": None if dec is None else dec.round,
        "decided_at": None if dec is None else dec.decided_at,
        "committed_at": None if state.committed is None else state.committed.committed_at,
        "handles": {} if dec is None else {u: len(d) for u, d in dec.handles.items()},
        "rows": {} if dec is None else dec.stats.get("rows", {}),
        "pending_handles": (
            {u: [h["data"]["txn"] for h in d] for u, d in dec.handles.items()}
            if dec is not None and state.committed is None
            else {}
        ),
        "not_restored": [] if state.committed is None else list(state.committed.not_restored),
    }


def status_command(args: argparse.Namespace) -> int:
    log = open_log(args.log)
    meta = log.meta()
    if meta is None:
        print(f"txsink status: no txsink log at {args.log}", file=sys.stderr)
        return 1
    states = log.states()
    docs = [_state_doc(s) for s in states]
    if args.json:
        print(
            json.dumps(
                {
                    "log": log.location,
                    "app_id": meta["app_id"],
                    "format_version": meta["version"],
                    "epochs": docs,
                },
                indent=1,
            )
        )
        return 0
    print(f"txsink log {log.location}  app {meta['app_id']}  format v{meta['version']}")
    print(f"{'epoch':>8}  {'status':<10} {'rounds':>6}  {'decided':<19}  {'committed':<19}  sinks")
    for d in docs:
        sinks = (
            ", ".join(
                f"{u}: {n} handles/{d['rows'].get(u, 0)} rows" for u, n in d["handles"].items()
            )
            or "-"
        )
        print(
            f"{d['epoch']:>8}  {d['status']:<10} {len(d['rounds']):>6}  "
            f"{_when(d['decided_at']):<19}  {_when(d['committed_at']):<19}  {sinks}"
        )
        for uid, txns in d["pending_handles"].items():
            for txn in txns:
                print(f"{'':>8}  pending {uid}: {txn}")
    pending = [d for d in docs if d["status"] == "decided"]
    print(
        f"{len(docs)} epochs, {sum(d['status'] == 'committed' for d in docs)} committed, "
        f"{len(pending)} decided and waiting for commit (recovery finishes them on restart)"
    )
    return 0


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", required=True, help="txsink log location")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


Command = Callable[[argparse.Namespace], int]

#: name -> (help, add the command's arguments, run it)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Command]] = {
    "demo": ("run the exactly-once demo on local files", demo.add_arguments, demo.demo_command),
    "status": ("show the epochs of a txsink log", _status_arguments, status_command),
    "inspect": (
        "write an HTML report (and optionally a CSV table) of a txsink log",
        _cli_inspect.add_arguments,
        _cli_inspect.inspect_command,
    ),
    "savepoint": (
        "create or restore a savepoint of the txsink log (and checkpoint)",
        _cli_state.add_savepoint_arguments,
        _cli_state.savepoint_command,
    ),
    "state": (
        "upgrade pipeline state (rename a sink uid)",
        _cli_state.add_state_arguments,
        _cli_state.state_command,
    ),
    "recover": (
        "commit decided epochs and abort lingering transactions, by hand",
        _cli_operate.add_recover_arguments,
        _cli_operate.recover_command,
    ),
    "abort": (
        "abort lingering (undecided) transactions, by hand",
        _cli_operate.add_abort_arguments,
        _cli_operate.abort_command,
    ),
    "chaos": (
        "run pipelines under fault plans and verify them (run, soak)",
        chaos_cli.add_arguments,
        chaos_cli.chaos_command,
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="txsink", description="exactly-once sinks for Spark")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, _run) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text))
    sub.choices["demo"].add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][2](args)
    except TxsinkError as err:
        print(f"txsink {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
