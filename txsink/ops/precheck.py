"""Checks before a query starts: what its first batch would refuse, found without running it.

:meth:`txsink.Coordinator.check` (and ``txsink check``) runs them; the first batch of
every query run still runs the sinks' part (:func:`check_sinks`). In order:

1. the DataFrame: classic PySpark, and a schema Arrow can carry;
2. the query's app id: ``app_id=``, else the id Spark keeps in the checkpoint's
   ``metadata`` (a checkpoint without it is a new query, which gets a new id at start);
3. the txsink log: readable, a txsink log of a supported version, a folder this process
   may write; it belongs to that app; the checkpoint does not restart below the log's last
   committed epoch;
4. the partitioning the sinks need: they agree, and its columns are the DataFrame's;
   for sinks that commit from the epoch's replay, that a replay deals every partition the
   same rows (:mod:`txsink.spark.stability`; the first batch of each query run checks it too);
5. every sink's own ``check(schema, app_id)`` hook, against its real target.

Nothing is bound or written here except what a sink's ``check`` hook creates (a missing
output folder, a Postgres progress table, a Kafka marker topic, as at the first batch).
Not known before the start, so checked at the first batch only: the trigger and
``asyncProgressTrackingEnabled`` (options of ``writeStream``, not of the DataFrame), and
the query id of a checkpoint that is not a local path.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from txsink.errors import (
    CheckpointMismatchError,
    ConfigurationError,
    LogError,
    TxsinkError,
    UnreachableError,
)
from txsink.protocol.epoch import checkpoint_reset_error
from txsink.spark import layout as _layout
from txsink.spark import stability as _stability
from txsink.spark.checks import (
    arrow_schema,
    check_columns,
    check_sink,
    check_sinks,
    no_app_error,
    plan_changes,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from txsink.contract import SinkContract
    from txsink.protocol.log import TxLog

__all__ = [
    "NEW_APP",
    "CheckResult",
    "check_or_raise",
    "check_sink",
    "check_sinks",
    "checkpoint_reset_error",
    "empty_log_error",
    "no_app_error",
    "run_checks",
]

T = TypeVar("T")

#: The app id the sinks are checked as when the query is new (Spark names it at start).
NEW_APP = "new-query"


@dataclass(frozen=True)
class CheckResult:
    """One check before the start: what it looked at, what it found, or its error."""

    what: str
    detail: str = ""
    error: TxsinkError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def line(self) -> str:
        """One line for a person: ``ok   <what>: <detail>`` or ``FAIL <error>``."""
        if self.error is None:
            return f"ok    {self.what}: {self.detail}"
        return f"FAIL  {one_line(self.error)}"


def empty_log_error(location: str) -> ConfigurationError:
    """A one-shot write on an empty log without ``app_id``."""
    return ConfigurationError(
        f"the txsink log at {location} is empty and no app_id was given: "
        "pass app_id=... for a one-shot write"
    )


def one_line(err: BaseException) -> str:
    """``str(err)`` on one line (a message never needs its line breaks to be read)."""
    return " ".join(str(err).split())


@dataclass(frozen=True)
class _App:
    id: str | None  # known before the start, or None (a new query, or unknown)
    source: str
    new: bool = False  # the checkpoint says: a new query
    next_batch: int | None = None


def run_checks(
    df: DataFrame,
    *,
    log: TxLog,
    sinks: Sequence[SinkContract[Any, Any]],
    app_id: str | None,
    checkpoint: str | os.PathLike[str] | None = None,
    from_savepoint: Any = None,
    streaming: bool | None = None,
) -> list[CheckResult]:
    """Every check of the module's list; one result each (a failed one holds its error).

    ``streaming``: whether the query is a streaming one (default: ``df.isStreaming``; a
    stand-in DataFrame of the schema is static).
    """
    results: list[CheckResult] = []

    def run(what: str, check: Callable[[], tuple[T, str]]) -> T | None:
        """Run one check: its value (None if it failed), its result recorded."""
        try:
            value, detail = check()
        except TxsinkError as err:
            results.append(CheckResult(what, error=err.with_context(phase="check")))
            return None
        results.append(CheckResult(what, detail))
        return value

    arrow = run("schema", lambda: _schema(df))
    if arrow is None:
        return results  # nothing else can be checked without it
    known = run("app", lambda: _app(app_id, checkpoint)) or _App(app_id, "")
    is_streaming = df.isStreaming if streaming is None else streaming
    owner = run("log", lambda: _log(log, known, from_savepoint, streaming=is_streaming))
    as_app = known.id or (None if known.new else owner) or NEW_APP
    run("partitioning", lambda: _partitioning(sinks, arrow))
    if any(s.commits_from_data for s in sinks):
        run("replay", lambda: _replay_stable(df, sinks))
    # Shown only when the first epoch would change a target's schema (or cannot); a target
    # out of reach is the sink's own check's to report (once), with the full schema.
    shown = len(results)
    seen = run("schema changes", lambda: _changes(sinks, arrow, as_app)) or {}
    step = results[shown]
    if step.detail == "none" or isinstance(step.error, UnreachableError):
        del results[shown]
    for sink in sinks:
        run(f"sink {sink.uid}", functools.partial(_sink, sink, seen.get(sink.uid, arrow), as_app))
    return results


def _changes(
    sinks: Sequence[SinkContract[Any, Any]], arrow: pa.Schema, app_id: str
) -> tuple[dict[str, pa.Schema], str]:
    """The schema changes the first epoch would make (:func:`plan_changes`); a sink's own
    check then judges the columns its target has."""
    changes, seen = plan_changes(sinks, arrow, app_id)
    told = [f"{uid}: {c.describe()}" for uid, c in changes.items()]
    return seen, "; ".join(told) or "none"


def _schema(df: DataFrame) -> tuple[pa.Schema, str]:
    arrow = arrow_schema(df)
    return arrow, ", ".join(f"{f.name} {f.type}" for f in arrow)


def _partitioning(sinks: Sequence[SinkContract[Any, Any]], arrow: pa.Schema) -> tuple[None, str]:
    part = _layout.required_partitioning(s.required_partitioning() for s in sinks)
    check_columns(part, arrow.names)
    return None, "any" if part is None else f"by {list(part.columns)}"


def _replay_stable(df: DataFrame, sinks: Sequence[SinkContract[Any, Any]]) -> tuple[None, str]:
    """Sinks that commit from the epoch's replay: a replay deals each partition its rows."""
    laid = _layout.laid_out(
        df, _layout.required_partitioning(s.required_partitioning() for s in sinks)
    )
    uids = [s.uid for s in sinks if s.commits_from_data]
    return None, _stability.check_stable(laid, uids)


def _sink(sink: SinkContract[Any, Any], arrow: pa.Schema, app_id: str) -> tuple[None, str]:
    check_sink(sink, arrow, app_id)
    return None, f"{sink!r} as app {app_id!r}"


def check_or_raise(
    df: DataFrame,
    *,
    log: TxLog,
    sinks: Sequence[SinkContract[Any, Any]],
    app_id: str | None,
    checkpoint: str | os.PathLike[str] | None = None,
    from_savepoint: Any = None,
) -> list[CheckResult]:
    """:func:`run_checks`; raises the first failure, with each other one as a note."""
    results = run_checks(
        df,
        log=log,
        sinks=sinks,
        app_id=app_id,
        checkpoint=checkpoint,
        from_savepoint=from_savepoint,
    )
    failed = [r.error for r in results if r.error is not None]
    if failed:
        for other in failed[1:]:
            failed[0].add_note(f"also failed: {one_line(other)}")
        raise failed[0]
    return results


def _app(app_id: str | None, checkpoint: str | os.PathLike[str] | None) -> tuple[_App, str]:
    found = _find_app(app_id, checkpoint)
    return found, found.source


def _find_app(app_id: str | None, checkpoint: str | os.PathLike[str] | None) -> _App:
    if app_id is not None:
        return _App(app_id, f"{app_id} (app_id=)")
    if checkpoint is None:
        return _App(None, "unknown until the query starts (no app_id=, no checkpoint=)")
    text = os.fspath(checkpoint)
    text = text[len("file://") :] if text.startswith("file://") else text
    if "://" in text:
        return _App(None, f"unknown: checkpoint {text} is not a local path txsink can read")
    root = Path(text).absolute()
    if not (root / "metadata").is_file():
        return _App(None, f"a new query (no {root / 'metadata'}): Spark names it at start", True)
    from txsink.ops.checkpoint import inspect_checkpoint

    try:
        info = inspect_checkpoint(root)
    except TxsinkError as err:
        raise ConfigurationError(
            f"{err.message}: give the query's checkpointLocation, or pass app_id="
        ) from err
    source = f"{info.query_id} (from {root / 'metadata'})"
    return _App(info.query_id, source, new=False, next_batch=info.next_batch)


def _log(log: TxLog, app: _App, from_savepoint: Any, *, streaming: bool) -> tuple[str | None, str]:
    """The app the log belongs to (None: empty) and what was found; raises what the
    first batch would."""
    from txsink.store import FileStore

    if isinstance(log.store, FileStore):
        _writable(log.store.root)
    meta = log.meta()
    owner = None if meta is None else str(meta.get("app_id"))
    if owner is None and from_savepoint is not None:
        from txsink.ops.savepoint import read_savepoint

        owner = read_savepoint(from_savepoint).app_id
    last = log.last_committed() if meta is not None else None
    if app.id is not None and owner is not None and owner != app.id:
        raise log.app_mismatch(owner, app.id)
    if app.new and owner is not None:
        raise CheckpointMismatchError(
            f"the txsink log at {log.location} belongs to app {owner!r}, but the checkpoint "
            "is new: the query will start under a new id, and its first batch would refuse "
            "this log. Give the query the checkpoint that belongs to this log, or use a new "
            "txsink log (and a new output folder or sink uid) with the new checkpoint"
        )
    if app.next_batch is not None and last is not None and app.next_batch < last:
        from txsink.protocol.lease import live_holder, refusal

        holder = live_holder(log)  # a running driver moved the log on: not a reset
        if holder is not None:
            raise refusal(holder)
        raise checkpoint_reset_error(log.location, app.next_batch, last)
    if not streaming and app.id is None and owner is None:
        raise empty_log_error(log.location)
    if owner is None:
        return None, f"{log.location}: empty (the first batch binds it to the query's app)"
    done = "no committed epoch" if last is None else f"last committed epoch {last}"
    restored = " (after the restore from the savepoint)" if meta is None else ""
    return owner, f"{log.location}: app {owner}{restored}, {done}"


def _writable(root: Path) -> None:
    """The log folder, or the nearest existing folder above it, may be written to."""
    path = root.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        what = "is not a folder" if not path.is_dir() else "is not writable by this process"
        raise LogError(
            f"the txsink log cannot be written at {root}: {path} {what}; give log= a folder "
            "this process can create and write"
        )
