"""``txsink status``: the epochs of a txsink log, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from txsink._format import when
from txsink.log import EpochState, open_log

__all__ = ["add_arguments", "status_command"]


def _when(ts: float | None) -> str:
    return when(ts or None)


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", required=True, help="txsink log location")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
