"""Read the txsink log as tables: Flink's State Processor API, read side, for txsink.

:func:`log_table` gives one row per (epoch, round, sink uid, handle), :func:`epoch_table`
one row per epoch, :func:`spark_log_table` the former as a Spark DataFrame. They read the
log's records directly and never need Spark (except, of course, the Spark variant) nor the
connectors that wrote the handles: an operator can inspect a log on a laptop.

Reading is one listing of ``epochs/`` plus one read per record (a few reads in parallel),
never one listing per epoch: a log on S3 with hundreds of epochs reads in seconds.
:func:`read_log` returns that :class:`LogSnapshot`; every function here accepts one, so a
caller that needs several views (the report, a CSV) reads the log once.

The log is read while a query may be writing it: a record listed and gone before it is
read (pruned) is skipped, and the snapshot is what the log held at about ``read_at``.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import pandas as pd

from txsink.errors import LogError
from txsink.protocol.blocks import BLOCK, EpochBlock, summarize
from txsink.protocol.log import CommitRecord, EpochDecision, EpochState, TxLog, open_log
from txsink.schema import SchemaChange
from txsink.store import LogStore
from txsink.txid import TxnId

if TYPE_CHECKING:
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "EPOCH_COLUMNS",
    "LOG_COLUMNS",
    "EpochRecords",
    "LogLike",
    "LogSnapshot",
    "epoch_table",
    "log_table",
    "read_log",
    "spark_log_table",
    "spark_schema",
]

_READ_THREADS = 8  # S3 reads are latency-bound; 8 in flight keep a 2-core driver idle

#: log_table's columns and their pandas dtypes ("ts" = datetime64[ns, UTC]).
LOG_COLUMNS: dict[str, str] = {
    "epoch": "int64",
    "round": "int64",
    "round_status": "object",
    "epoch_status": "object",
    "sink_uid": "object",
    "txn": "object",
    "partition": "Int64",
    "attempt": "Int64",
    "serializer": "object",
    "handle_version": "Int64",
    "rows": "Int64",
    "bytes": "Int64",
    "claimed_at": "ts",
    "decided_at": "ts",
    "voided_at": "ts",
    "committed_at": "ts",
    "commit_latency_s": "float64",
    "precommit_s": "float64",
    "not_restored": "bool",
    "void_reason": "object",
    "host": "object",
    "pid": "Int64",
}

#: epoch_table's columns and their pandas dtypes.
EPOCH_COLUMNS: dict[str, str] = {
    "epoch": "int64",
    "status": "object",
    "rounds": "int64",
    "voided_rounds": "int64",
    "decided_round": "Int64",
    "sinks": "int64",
    "handles": "int64",
    "rows": "Int64",
    "bytes": "Int64",
    "claimed_at": "ts",
    "decided_at": "ts",
    "committed_at": "ts",
    "commit_latency_s": "float64",
    "precommit_s": "float64",
    "not_restored": "object",
    "blocked_since": "ts",
    "blocked_attempts": "Int64",
    "blocked_reason": "object",
    "schema_changes": "object",
}


# -- reading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochRecords:
    """The raw JSON records of one epoch, keyed by round.

    ``outcomes`` holds each round's ``decision-<round>.json``: a decision
    (``kind`` absent or ``"decision"``) or a void (``kind == "void"``).
    """

    epoch: int
    claims: dict[int, dict[str, Any]]
    outcomes: dict[int, dict[str, Any]]
    committed: dict[str, Any] | None
    blocks: tuple[dict[str, Any], ...] = ()  # blocked-* records, oldest first

    @property
    def decision(self) -> dict[str, Any] | None:
        """The decided round's record, if any round was decided (at most one can be)."""
        for rnd in sorted(self.outcomes):
            if self.outcomes[rnd].get("kind", "decision") == "decision":
                return self.outcomes[rnd]
        return None

    @property
    def voided(self) -> tuple[int, ...]:
        return tuple(r for r in sorted(self.outcomes) if self.outcomes[r].get("kind") == "void")

    @property
    def rounds(self) -> tuple[int, ...]:
        """Every round the log knows of (claimed, or decided/voided without a claim)."""
        return tuple(sorted(set(self.claims) | set(self.outcomes)))

    def state(self) -> EpochState:
        """The same :class:`~txsink.protocol.log.EpochState` :meth:`TxLog.state` would build."""
        doc = self.decision
        decision = None
        if doc is not None:
            decision = EpochDecision(
                epoch=self.epoch,
                round=int(doc["round"]),
                handles={u: list(d) for u, d in doc.get("handles", {}).items()},
                decided_at=float(doc.get("decided_at", 0.0)),
                stats=dict(doc.get("stats", {})),
            )
        committed = None
        if self.committed is not None:
            committed = CommitRecord(
                epoch=self.epoch,
                round=int(self.committed.get("round", -1)),
                committed_at=float(self.committed.get("committed_at", 0.0)),
                not_restored=tuple(self.committed.get("not_restored", ())),
            )
        blocked = summarize(self.epoch, list(self.blocks)) if committed is None else None
        return EpochState(
            self.epoch, tuple(sorted(self.claims)), decision, self.voided, committed, blocked
        )


@dataclass(frozen=True)
class LogSnapshot:
    """Everything a txsink log held when it was read: meta plus every epoch's records."""

    location: str
    meta: dict[str, Any]
    epochs: tuple[EpochRecords, ...]
    read_at: float

    @property
    def app_id(self) -> str:
        return str(self.meta.get("app_id", ""))

    def decided_txns(self) -> set[str]:
        """Every transaction name that some decision of this log names."""
        return {
            str(doc.get("data", {}).get("txn"))
            for rec in self.epochs
            if (dec := rec.decision) is not None
            for docs in dec.get("handles", {}).values()
            for doc in docs
        }


#: What every function here accepts as ``log``.
LogLike: TypeAlias = "str | os.PathLike[str] | LogStore | TxLog | LogSnapshot"


def read_log(log: LogLike) -> LogSnapshot:
    """Read a whole log once: a path, ``file://`` or ``s3://`` URL, LogStore, TxLog or snapshot.

    Raises :class:`~txsink.errors.LogError` if there is no log at the location (no
    ``meta.json``) or a record is not JSON.
    """
    if isinstance(log, LogSnapshot):
        return log
    txlog = open_log(log)
    meta = txlog.meta()
    if meta is None:
        raise LogError(
            f"no txsink log at {txlog.location}: meta.json is missing. Pass the location the "
            "Coordinator was given as log=... (a folder path or a store URL)"
        )
    read_at = time.time()
    keys = [k for k in txlog.store.list("epochs/") if k.endswith(".json")]
    docs = _read_all(txlog, keys)
    grouped: dict[int, tuple[dict[int, Any], dict[int, Any], list[Any], list[Any]]] = {}
    for key, doc in sorted(zip(keys, docs, strict=True), key=lambda kd: kd[0]):
        parts = key.split("/")
        if doc is None or len(parts) != 3 or not parts[1].isdigit():
            continue  # pruned between the listing and the read, or not a record
        claims, outcomes, committed, blocks = grouped.setdefault(int(parts[1]), ({}, {}, [], []))
        name = parts[2]
        if name.startswith(BLOCK):
            blocks.append(doc)
        elif name.startswith("claim-"):
            claims[int(doc.get("round", name[6:12]))] = doc
        elif name.startswith("decision-"):
            outcomes[int(doc.get("round", name[9:15]))] = doc
        elif name == "committed.json":
            committed.append(doc)
    epochs = tuple(
        EpochRecords(e, c, o, com[0] if com else None, tuple(b))
        for e, (c, o, com, b) in sorted(grouped.items())
    )
    return LogSnapshot(txlog.location, meta, epochs, read_at)


def _read_all(txlog: TxLog, keys: list[str]) -> list[dict[str, Any] | None]:
    def one(key: str) -> dict[str, Any] | None:
        raw = txlog.store.read(key)
        return None if raw is None else txlog.parse_record(key, raw)

    if len(keys) < 2 * _READ_THREADS:
        return [one(k) for k in keys]
    with ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="txsink-inspect") as pool:
        return list(pool.map(one, keys))


# -- the tables ---------------------------------------------------------------------------


def log_table(log: LogLike) -> pd.DataFrame:
    """One row per (epoch, round, sink uid, handle) of the log, oldest first.

    ``log``: a path, ``file://`` or ``s3://`` URL, :class:`~txsink.store.LogStore`,
    :class:`~txsink.protocol.log.TxLog` or :class:`LogSnapshot`. Columns (see :data:`LOG_COLUMNS`):

    - ``epoch``, ``round``: the micro-batch and its pre-commit run.
    - ``round_status``: ``decided`` (this round is the epoch's decision), ``void`` (fenced:
      superseded, or aborted by a failed pre-commit or by recovery) or ``claimed`` (claimed
      but neither decided nor voided: running now, or its driver died before deciding and
      no recovery has run since).
    - ``epoch_status``: ``committed``, ``decided`` (recovery will commit it), ``blocked``
      (decided, but a target refuses the commit until an operator fixes it), ``aborted``
      (every round voided) or ``open`` (see :attr:`~txsink.protocol.log.EpochState.status`).
    - ``sink_uid``, ``txn``, ``partition``, ``attempt``, ``serializer``, ``handle_version``:
      the handle (decided rounds only; a round without handles has one row with these
      null). ``partition``/``attempt`` are parsed from the transaction name.
    - ``rows``, ``bytes``: the handle's ``rows`` and ``nbytes``, when it records them.
    - ``claimed_at``, ``decided_at``, ``voided_at``, ``committed_at``: UTC timestamps of
      the round's claim, decision, void, and the epoch's committed mark (the last only on
      the decided round's rows).
    - ``commit_latency_s``: ``committed_at - decided_at`` (the commit phase, or how long a
      decided epoch waited for recovery); ``precommit_s``: the decision's pre-commit time.
    - ``not_restored``: the epoch was committed without this uid's handles
      (``allow_non_restored_state``): its rows of that epoch were never written.
    - ``void_reason``: why the round was voided; ``host``, ``pid``: the claiming driver.
    """
    return _frame(_log_records(read_log(log)), LOG_COLUMNS)


def epoch_table(log: LogLike) -> pd.DataFrame:
    """One row per epoch, oldest first (columns: :data:`EPOCH_COLUMNS`).

    ``rounds``/``voided_rounds`` count the epoch's rounds; ``handles``, ``sinks``,
    ``rows`` and ``bytes`` describe its decision, summed over every sink (``rows`` from
    the decision's own counts, else from the handles). ``claimed_at`` is the first claim,
    so ``committed_at - claimed_at`` is the epoch's whole life, crashes included;
    ``not_restored`` is a comma-separated list of uids or null. A *blocked* epoch
    (status ``blocked``: decided, and refused for good by a target until fixed) has
    ``blocked_since`` (its first refusal), ``blocked_attempts`` and ``blocked_reason``
    (sink, shard, the target's refusal and the fix); null for every other epoch.
    """
    return _frame(_epoch_records(read_log(log)), EPOCH_COLUMNS)


def spark_schema() -> StructType:
    """The explicit Spark schema of :func:`spark_log_table` (timestamps as TimestampType)."""
    from pyspark.sql import types as T

    kinds = {
        "int64": T.LongType(),
        "Int64": T.LongType(),
        "object": T.StringType(),
        "bool": T.BooleanType(),
        "float64": T.DoubleType(),
        "ts": T.TimestampType(),
    }
    return T.StructType(
        [
            T.StructField(name, kinds[kind], nullable=kind not in ("int64", "bool"))
            for name, kind in LOG_COLUMNS.items()
        ]
    )


def spark_log_table(spark: SparkSession, log: LogLike) -> SparkDataFrame:
    """:func:`log_table` as a Spark DataFrame with :func:`spark_schema` (read on the driver)."""
    kinds = LOG_COLUMNS
    rows = [
        tuple(
            _utc(rec[name]) if kinds[name] == "ts" and rec[name] is not None else rec[name]
            for name in kinds
        )
        for rec in _log_records(read_log(log))
    ]
    return spark.createDataFrame(rows, schema=spark_schema())


# -- building the records -----------------------------------------------------------------


def _log_records(snap: LogSnapshot) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for rec in snap.epochs:
        epoch_status = rec.state().status
        committed = rec.committed or {}
        not_restored = set(committed.get("not_restored", ()))
        for rnd in rec.rounds:
            claim = rec.claims.get(rnd, {})
            outcome = rec.outcomes.get(rnd)
            kind = None if outcome is None else outcome.get("kind", "decision")
            base: dict[str, Any] = {name: None for name in LOG_COLUMNS}
            base.update(
                epoch=rec.epoch,
                round=rnd,
                round_status={"decision": "decided", "void": "void"}.get(str(kind), "claimed"),
                epoch_status=epoch_status,
                claimed_at=_num(claim.get("at")),
                host=claim.get("host"),
                pid=_int(claim.get("pid")),
                not_restored=False,
            )
            if outcome is not None and kind == "void":
                base.update(voided_at=_num(outcome.get("at")), void_reason=outcome.get("reason"))
            if outcome is None or kind != "decision":
                out.append(base)
                continue
            decided_at = _num(outcome.get("decided_at"))
            committed_at = _num(committed.get("committed_at")) if rec.committed else None
            base.update(
                decided_at=decided_at,
                committed_at=committed_at,
                commit_latency_s=_latency(decided_at, committed_at),
                precommit_s=_num(outcome.get("stats", {}).get("seconds", {}).get("precommit")),
            )
            handles = outcome.get("handles", {})
            rows_before = len(out)
            for uid, docs in handles.items():
                for doc in docs:
                    out.append(
                        {**base, **_handle_fields(uid, doc), "not_restored": uid in not_restored}
                    )
            if len(out) == rows_before:  # a decision without handles (an empty epoch)
                out.append(base)
    return out


def _handle_fields(uid: str, doc: dict[str, Any]) -> dict[str, Any]:
    data = doc.get("data", {})
    txn_name = data.get("txn")
    txn = TxnId.try_parse(str(txn_name)) if txn_name is not None else None
    return {
        "sink_uid": uid,
        "txn": None if txn_name is None else str(txn_name),
        "partition": None if txn is None else txn.partition,
        "attempt": None if txn is None else txn.attempt,
        "serializer": doc.get("serializer"),
        "handle_version": _int(doc.get("version")),
        "rows": _int(data.get("rows")),
        "bytes": _int(data.get("nbytes")),
    }


def _epoch_records(snap: LogSnapshot) -> list[dict[str, Any]]:
    out = []
    for rec in snap.epochs:
        state = rec.state()
        dec = rec.decision or {}
        handles: dict[str, list[dict[str, Any]]] = dec.get("handles", {})
        docs = [d for ds in handles.values() for d in ds]
        stats_rows = dec.get("stats", {}).get("rows")
        if isinstance(stats_rows, dict) and stats_rows:
            rows: int | None = sum(int(n) for n in stats_rows.values())
        else:
            rows = _sum(d.get("data", {}).get("rows") for d in docs)
        decided_at = _num(dec.get("decided_at"))
        committed_at = _num((rec.committed or {}).get("committed_at"))
        claims = [t for c in rec.claims.values() if (t := _num(c.get("at"))) is not None]
        not_restored = list((rec.committed or {}).get("not_restored", ()))
        out.append(
            {
                "epoch": rec.epoch,
                "status": state.status,
                "rounds": len(rec.rounds),
                "voided_rounds": len(rec.voided),
                "decided_round": None if not dec else _int(dec.get("round")),
                "sinks": sum(1 for ds in handles.values() if ds),
                "handles": len(docs),
                "rows": rows if dec else None,
                "bytes": _sum(d.get("data", {}).get("nbytes") for d in docs) if dec else None,
                "claimed_at": min(claims) if claims else None,
                "decided_at": decided_at,
                "committed_at": committed_at,
                "commit_latency_s": _latency(decided_at, committed_at),
                "precommit_s": _num(dec.get("stats", {}).get("seconds", {}).get("precommit")),
                "not_restored": ",".join(not_restored) if not_restored else None,
                "blocked_since": None if state.blocked is None else state.blocked.first_seen,
                "blocked_attempts": None if state.blocked is None else state.blocked.attempts,
                "blocked_reason": None if state.blocked is None else _block_text(state.blocked),
                "schema_changes": _schema_text(dec.get("schema") or {}),
            }
        )
    return out


def _schema_text(docs: dict[str, Any]) -> str | None:
    """``pg: adds note (string); s3: ...`` for an epoch whose decision changed schemas."""
    told = [f"{uid}: {SchemaChange.from_json(uid, doc).describe()}" for uid, doc in docs.items()]
    return "; ".join(told) or None


def _block_text(block: EpochBlock) -> str:
    shard = "" if block.shard is None else f" shard {block.shard}"
    fix = f" Fix: {block.fix}" if block.fix else ""
    return f"sink {block.sink_uid}{shard}: {block.reason}{fix}"


def _frame(records: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    data: dict[str, Any] = {}
    for name, kind in columns.items():
        values = [r[name] for r in records]
        if kind == "ts":
            seconds = pd.Series([float("nan") if v is None else v for v in values], dtype="float64")
            data[name] = pd.to_datetime(seconds, unit="s", utc=True)
        elif kind == "object":
            data[name] = pd.Series(values, dtype="object")
        elif kind == "float64":
            data[name] = pd.Series(
                [float("nan") if v is None else v for v in values], dtype="float64"
            )
        elif kind == "Int64":
            data[name] = pd.Series(pd.array(values, dtype="Int64"))
        elif kind == "bool":
            data[name] = pd.Series([bool(v) for v in values], dtype="bool")
        else:
            data[name] = pd.Series(values, dtype="int64")
    return pd.DataFrame(data, columns=list(columns))


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    num = _num(value)
    return None if num is None else int(num)


def _sum(values: Iterable[Any]) -> int | None:
    nums = [n for v in values if (n := _int(v)) is not None]
    return sum(nums) if nums else None


def _latency(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)
