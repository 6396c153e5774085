"""``txsink status``: the epochs of a txsink log, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from txsink.kit.text import when
from txsink.ops.schemas import schema_history
from txsink.protocol.lease import DriverLease, current_lease
from txsink.protocol.log import EpochState, open_log

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
        "blocked": None if state.blocked is None else state.blocked.to_doc(),
    }


def _lease_doc(lease: DriverLease | None, now: float) -> dict[str, Any] | None:
    if lease is None:
        return None
    doc = lease.to_doc()
    del doc["version"]
    doc["state"] = (
        "released" if lease.released else "expired" if now >= lease.expires_at() else "held"
    )
    return doc


def _lease_line(doc: dict[str, Any] | None) -> str:
    if doc is None:
        return "driver lease: none (no driver has run this log yet)"
    who = f"{doc['by']} on host {doc['host']}, pid {doc['pid']}"
    if doc["state"] == "released":
        return f"driver lease: free (released by {who} {_when(doc['renewed_at'])})"
    span = f"since {_when(doc['acquired_at'])}, renewed {_when(doc['renewed_at'])}"
    state = "held" if doc["state"] == "held" else "expired"
    return f"driver lease: {state} by {who} {span}, lease_s={doc['lease_s']:g}"


def status_command(args: argparse.Namespace) -> int:
    log = open_log(args.log)
    meta = log.meta()
    if meta is None:
        print(f"txsink status: no txsink log at {args.log}", file=sys.stderr)
        return 1
    states = log.states()
    docs = [_state_doc(s) for s in states]
    lease = _lease_doc(current_lease(log), time.time())
    history = schema_history(log, states)
    if args.json:
        print(
            json.dumps(
                {
                    "log": log.location,
                    "app_id": meta["app_id"],
                    "format_version": meta["version"],
                    "epochs": docs,
                    "lease": lease,
                    "schema_changes": [e.as_dict() for e in history],
                },
                indent=1,
            )
        )
        return 0
    print(f"txsink log {log.location}  app {meta['app_id']}  format v{meta['version']}")
    print(_lease_line(lease))
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
        block = d["blocked"]
        if block is not None:
            shard = "" if block["shard"] is None else f" shard {block['shard']}"
            print(
                f"{'':>8}  BLOCKED since {_when(block['first_seen'])} "
                f"({block['attempts']} refused attempt(s)), sink {block['sink_uid']}{shard}: "
                f"{block['reason']}"
            )
            if block["fix"]:
                print(f"{'':>8}  fix: {block['fix']}; then run `txsink recover` or restart")
    if history:
        print("schema changes (docs/schema-evolution.md):")
        for event in history:
            print(f"{'':>8}  {event.line()}")
    print(_summary([d["status"] for d in docs]))
    return 0


def _summary(statuses: list[str]) -> str:
    """The last line: every status the table shows is counted (the rare ones when present)."""
    count = {s: statuses.count(s) for s in set(statuses)}
    rare = {
        "aborted": "aborted (nothing of them is visible)",
        "open": "open (running, or their driver died before deciding: recovery voids them)",
        "blocked": "BLOCKED (the target refuses them until the cause is fixed)",
    }
    return (
        f"{len(statuses)} epochs, {count.get('committed', 0)} committed, "
        f"{count.get('decided', 0)} decided and waiting for commit "
        "(recovery finishes them on restart)"
        + "".join(f", {count[s]} {text}" for s, text in rare.items() if count.get(s))
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", required=True, help="txsink log location")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
