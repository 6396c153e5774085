"""Upgrades of a pipeline's state: renaming a sink uid (in the log and in the targets).

The uid is the name that ties logged state to a sink (Flink's operator uid). It lives in
two places, and a rename must move both:

* the txsink log: each epoch's decision keys its handles by uid;
* the targets, where each connector keys what it writes by uid:

  ========  ========================================================  =====================
  connector keyed by uid                                              on rename
  ========  ========================================================  =====================
  files     data files ``epoch=<e>/<uid>-p….<ext>``; manifests         manifests move to the
            ``_manifests/<uid>-<epoch>.json``; staging folders         new uid (they list the
            ``_txsink/staging/txsink.<app>.<uid>.…``                   old files, which keep
                                                                       their names); lingering
                                                                       stages aborted
  s3        object keys ``…/<uid>-p….<ext>``; manifests                as files; lingering
            ``_manifests/<uid>-<epoch>.json``; upload markers           uploads (and their
            ``_txsink/uploads/<uid>/…``                                markers) aborted
  kafka     transactional ids ``<prefix>-<uid>-<shard>``; markers      old transactional ids
            ``<app>/<uid>/<shard>`` in the marker topic; WAL folders    fenced (an open
            ``txsink.<app>.<uid>.…``                                   transaction of a dead
                                                                       producer is aborted);
                                                                       lingering WAL aborted;
                                                                       markers stay (history)
  postgres  prepared transaction gids ``txsink.<app>.<uid>.…``;        lingering prepared
            progress rows (app_id, uid, gid)                           transactions rolled
                                                                       back; progress rows
                                                                       re-labelled
  ========  ========================================================  =====================

Why markers, object keys and gids of committed epochs stay as they are: they name what
was prepared and committed under the old uid, and nothing reads them again once the epoch
is committed (a Kafka marker only answers "is *this* epoch committed?" for the epoch being
committed; the first epoch under the new uid has no marker yet and is produced normally).
For the same reason the handles' transaction names inside rewritten decisions keep the
old uid: only the key that maps handles to a sink changes.

Safety: a rename needs a stopped pipeline at a fully committed epoch. With an epoch
decided but not committed, its handles would be finished by the new uid against targets
whose idempotency checks (markers, manifests) are keyed by the old one: duplicates.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from txsink.contract import SinkContract
from txsink.errors import StateError
from txsink.kit.jsonrows import dumps_record
from txsink.observe.logs import get_logger
from txsink.protocol.commit import abort_one
from txsink.protocol.log import TxLog, open_log
from txsink.txid import check_name

__all__ = ["JOURNAL", "RenameReport", "migrate_target", "rename_uid"]

AnySink = SinkContract[Any, Any]
#: The rename in progress; its presence makes the same command resume it.
JOURNAL = "upgrades/rename-uid.json"


@dataclass
class RenameReport:
    """What :func:`rename_uid` did (or, with ``dry_run``, would do), as plain lines."""

    log: str
    old: str
    new: str
    dry_run: bool
    resumed: bool = False
    epochs: list[int] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)


def rename_uid(
    log: str | os.PathLike[str] | TxLog,
    old: str,
    new: str,
    *,
    dry_run: bool = False,
    sinks: Sequence[AnySink] = (),
) -> RenameReport:
    """Rename sink uid ``old`` to ``new`` in the txsink log (and in the targets of ``sinks``).

    ``sinks``: the pipeline's sinks configured with the NEW uid (others are ignored); their
    targets are migrated by :func:`migrate_target`. Without them only the log changes, and
    the target-side steps of docs/upgrades.md are yours to run.

    Crash safety. Records are write-once, so each decision is rewritten in place by a
    journaled replace: a journal record ``upgrades/rename-uid.json`` first; per epoch, the
    new decision under a side key ``rewrite-<round>.json``, then delete and re-create
    ``decision-<round>.json`` from it, then drop the side key; the journal last. Every
    intermediate state is harmless to a pipeline (only committed epochs are touched, and
    a committed epoch's status does not depend on its decision) and the same command
    resumes it. Rebuilding the whole log elsewhere instead would move the log's location,
    which the pipeline's configuration and Spark's checkpoint name: a savepoint does that,
    when a move is wanted.

    Raises:
        StateError: an epoch is decided but not committed, or open; ``old`` is not in the
            log; ``new`` is already used; another rename is unfinished.
    """
    check_name("sink uid", old)
    check_name("sink uid", new)
    if old == new:
        raise StateError(f"rename-uid: the old and the new uid are both {old!r}")
    txlog = open_log(log)
    meta = txlog.meta()
    if meta is None:
        raise StateError(f"rename-uid: no txsink log at {txlog.location}: check --log")
    app_id = str(meta["app_id"])
    report = RenameReport(txlog.location, old, new, dry_run)
    report.resumed = _check_journal(txlog, old, new)
    _refuse_unfinished(txlog)
    uses = _uses(txlog)
    if not report.resumed:
        if new in uses:
            raise StateError(
                f"rename-uid: uid {new!r} is already used in the txsink log at "
                f"{txlog.location} (epochs {uses[new][:5]}…): pick an unused uid",
                sink_uid=new,
            )
        if old not in uses:
            raise StateError(
                f"rename-uid: uid {old!r} is not in the retained epochs of the txsink log at "
                f"{txlog.location} (uids there: {sorted(uses)}): check the spelling",
                sink_uid=old,
            )
    report.epochs = sorted(uses.get(old, []))
    if report.resumed:  # an epoch cut between delete and create has its side record only
        report.epochs = sorted({*report.epochs, *_side_epochs(txlog)})
    verb = "would rewrite" if dry_run else "rewrote"
    if not dry_run:
        doc = {"version": 1, "old": old, "new": new, "started_at": time.time()}
        txlog.store.create(JOURNAL, (json.dumps(doc, indent=1) + "\n").encode())
    for sink in sinks:
        if sink.uid == new:
            report.actions += migrate_target(sink, old, app_id=app_id, dry_run=dry_run)
    if not any(s.uid == new for s in sinks):
        report.actions.append(
            f"targets not migrated (no sink with uid {new!r} given): see docs/upgrades.md"
        )
    for epoch in report.epochs:
        if not dry_run:
            _rewrite_epoch(txlog, epoch, old, new)
    report.actions.append(
        f"log {txlog.location}: {verb} the decisions of {len(report.epochs)} epoch(s) "
        f"{_span(report.epochs)}, moving the handles of {old!r} to {new!r}"
    )
    if not dry_run:
        txlog.store.delete(JOURNAL)
    return report


def _check_journal(log: TxLog, old: str, new: str) -> bool:
    raw = log.store.read(JOURNAL)
    if raw is None:
        return False
    doc = json.loads(raw)
    if (doc.get("old"), doc.get("new")) != (old, new):
        raise StateError(
            f"rename-uid: the txsink log at {log.location} has an unfinished rename "
            f"{doc.get('old')!r} -> {doc.get('new')!r}: run that rename again to finish it "
            "first"
        )
    return True


def _refuse_unfinished(log: TxLog) -> None:
    """Refuse a log with a decided-but-uncommitted or an open epoch (see the module doc)."""
    decided, open_ = [], []
    for state in log.states():
        if state.committed is not None:
            continue
        if state.decision is not None:
            decided.append(state.epoch)
        elif set(state.rounds) - set(state.voided):
            open_.append(state.epoch)
    if decided:
        raise StateError(
            f"the txsink log at {log.location} has epoch(s) {decided} decided but not "
            "committed: restart the pipeline with its old configuration so recovery "
            "finishes them (or run `txsink recover`), stop it, then rename",
            epoch=decided[0],
        )
    if open_:
        raise StateError(
            f"the txsink log at {log.location} has open epoch(s) {open_} (claimed, neither "
            "decided nor voided): a query may be running, stop it first; if it crashed in "
            "that epoch's pre-commit, restart it once so recovery voids the round",
            epoch=open_[0],
        )


def _uses(log: TxLog) -> dict[str, list[int]]:
    """Every uid named by a retained decision (or not-restored list), with its epochs."""
    uses: dict[str, list[int]] = {}
    for state in log.states():
        uids = set(state.decision.handles) if state.decision is not None else set()
        if state.committed is not None:
            uids.update(state.committed.not_restored)
        for uid in uids:
            uses.setdefault(uid, []).append(state.epoch)
    return uses


def _rewrite_epoch(log: TxLog, epoch: int, old: str, new: str) -> None:
    """Journaled replace of one epoch's decision record (see :func:`rename_uid`)."""
    state = log.state(epoch)
    store = log.store
    prefix = f"epochs/{epoch:020d}/"
    side_keys = [k for k in store.list(prefix) if k.rsplit("/", 1)[1].startswith("rewrite-")]
    if state.decision is None and not side_keys:
        return
    round_ = state.decision.round if state.decision is not None else int(side_keys[0][-11:-5])
    key = f"{prefix}decision-{round_:06d}.json"
    side = f"{prefix}rewrite-{round_:06d}.json"
    current = store.read(key)
    wanted = store.read(side)
    if wanted is None:
        if current is None:  # pragma: no cover - decided epochs have the record
            return
        doc = json.loads(current)
        if doc.get("kind") != "decision" or old not in doc.get("handles", {}):
            return  # nothing of the old uid here (rewritten already)
        wanted = _renamed(doc, old, new)
        if not store.create(side, wanted):
            wanted = store.read(side) or wanted
    if current != wanted:
        if current is not None:
            store.delete(key)
        if not store.create(key, wanted) and store.read(key) != wanted:
            raise StateError(
                f"rename-uid: the decision of epoch {epoch} in {log.location} was written by "
                "someone else while it was being rewritten: a pipeline is running on this log. "
                "Stop it, check `txsink status`, and run the rename again",
                epoch=epoch,
            )
    store.delete(side)


def _side_epochs(log: TxLog) -> list[int]:
    return [
        int(key.split("/")[1])
        for key in log.store.list("epochs/")
        if key.rsplit("/", 1)[1].startswith("rewrite-")
    ]


def _renamed(doc: dict[str, Any], old: str, new: str) -> bytes:
    out = dict(doc)
    out["handles"] = {(new if uid == old else uid): hs for uid, hs in doc["handles"].items()}
    stats = dict(doc.get("stats", {}))
    if isinstance(stats.get("rows"), dict):
        stats["rows"] = {(new if u == old else u): n for u, n in stats["rows"].items()}
    out["stats"] = stats
    if isinstance(doc.get("schema"), dict):  # the schema changes (issue #41) are by uid too
        out["schema"] = {(new if u == old else u): c for u, c in doc["schema"].items()}
    out["renamed_uids"] = [*doc.get("renamed_uids", []), {"from": old, "to": new}]
    return dumps_record(out)


def _span(epochs: list[int]) -> str:
    if not epochs:
        return "(none)"
    return f"{epochs[0]}..{epochs[-1]}" if len(epochs) > 1 else str(epochs[0])


# -- target side ----------------------------------------------------------------------------


def migrate_target(sink: AnySink, old: str, *, app_id: str, dry_run: bool = False) -> list[str]:
    """Move what ``sink``'s target keys by uid from ``old`` to ``sink.uid``; idempotent.

    ``sink`` is configured with the NEW uid. Every connector: the lingering (prepared, no
    decision names them) transactions of ``old`` are aborted, since recovery under the new
    uid never lists them (safe only with no epoch decided-but-uncommitted or open, which
    :func:`rename_uid` checks). Then the connector's own step, its
    :meth:`~txsink.contract.SinkContract.migrate_uid` hook (see the module doc).
    Returns one plain line per action.
    """
    lines = _abort_lingering(sink, old, app_id, dry_run)
    return lines + sink.migrate_uid(old, app_id=app_id, dry_run=dry_run)


def _as_old(sink: AnySink, old: str) -> AnySink:
    """A driver-side copy of ``sink`` under the old uid (fresh connections, no coordinator)."""
    clone = copy.copy(sink)
    state = getattr(sink, "__getstate__", None)
    clone.__dict__.update(state() if callable(state) else sink.__dict__)
    clone.uid = old
    return clone


def _abort_lingering(sink: AnySink, old: str, app_id: str, dry_run: bool) -> list[str]:
    old_sink = _as_old(sink, old)
    lingering = list(old_sink.list_prepared(app_id))
    if not dry_run:
        log = get_logger(__name__, uid=old)
        for handle in lingering:
            abort_one(old_sink, handle, f"its sink uid is renamed to {sink.uid}", log=log)
    verb = "would abort" if dry_run else "aborted"
    return [f"{sink!r}: {verb} {len(lingering)} lingering transaction(s) of uid {old!r}"]
