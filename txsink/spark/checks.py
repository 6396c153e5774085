"""The checks of a query run's first batch, on the driver: the epoch's schema as the sinks
see it (Arrow), the partitioning the sinks need, then each sink's own ``check(schema,
app_id)`` hook against its real target, and that a fresh log's app is not one its targets
already remember.

The same checks run before the start (:mod:`txsink.ops.precheck`, ``txsink check``) and
at the first batch of every query run (:class:`~txsink.spark.epoch.SparkEpochs`), so they
live once, here: they need the epoch's schema and the layout's rules, not a DataFrame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txsink.errors import ConfigurationError, InternalError, TxsinkError, spark_condition
from txsink.schema import SchemaChange
from txsink.spark import evolve as _evolve
from txsink.spark import versions as _versions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from txsink.contract import Partitioning, SinkContract
    from txsink.protocol.log import TxLog

__all__ = ["arrow_schema", "check_sink", "check_sinks", "no_app_error", "plan_changes"]


def no_app_error(*, connect: bool = False) -> ConfigurationError:
    """A coordinator called without ``app_id`` where no query id is in sight: by hand,
    outside a streaming query, or under Spark Connect (``connect``), whose foreachBatch
    cannot see its query's id."""
    if connect:
        return ConfigurationError(
            "txsink.Coordinator runs under Spark Connect, where foreachBatch cannot see its "
            "streaming query's id (the app id txsink binds its log to): pass app_id=... to "
            "the Coordinator, a name that stays the same for as long as the query's "
            "checkpoint does (to keep a log a classic query wrote: the id in the "
            "checkpoint's metadata file)",
            phase="check",
        )
    return ConfigurationError(
        "txsink.Coordinator was called outside a streaming query's foreachBatch and "
        "without app_id: pass app_id=..., or use coordinator.write(df) for a static "
        "DataFrame"
    )


def check_sink(
    sink: SinkContract[Any, Any], schema: pa.Schema, app_id: str, fresh: TxLog | None = None
) -> None:
    """Run ``sink.check`` with the context every error of it carries; an exception that is
    not a txsink error (a connector's gap) becomes one, naming the sink and the phase.
    ``fresh``: the log, when it holds no epoch: the target must remember no epoch of
    ``app_id`` either."""
    ctx: dict[str, Any] = {"sink_uid": sink.uid, "phase": "check", "connector": sink.connector}
    try:
        sink.check(schema, app_id)
    except TxsinkError as err:
        err.with_context(**ctx)
        raise
    except (TypeError, AttributeError) as err:  # a call our code or a library misreads
        raise InternalError.of(err, f"sink {sink.uid!r}'s start-up check", **ctx) from err
    except Exception as err:
        text = str(err).strip().splitlines()
        raise ConfigurationError(
            f"the start-up check failed with {type(err).__name__}: {text[0] if text else ''}. "
            "Fix the cause it names (the sink's target, its settings), then start again",
            **ctx,
        ) from err
    if fresh is not None:
        _check_not_recorded(sink, app_id, fresh)


def check_columns(part: Partitioning | None, columns: Sequence[str]) -> None:
    """The sinks' partitioning ``part`` (:func:`~txsink.spark.layout.required_partitioning`)
    names only columns among ``columns`` (the DataFrame's)."""
    missing = [c for c in part.columns if c not in set(columns)] if part is not None else []
    if part is not None and missing:
        raise ConfigurationError(
            f"the sinks partition each epoch by {list(part.columns)}, but the DataFrame "
            f"has no column {missing[0]!r}: add it, or change the sinks' key (upsert key, "
            "shard_by)",
            column=missing[0],
            phase="check",
        )


def check_sinks(
    sinks: Sequence[SinkContract[Any, Any]],
    schema: pa.Schema,
    app_id: str,
    part: Partitioning | None,
    *,
    log: TxLog | None = None,
    path: str | None = None,
) -> dict[str, SchemaChange]:
    """What the first batch of a query run checks (and an epoch whose schema changed):
    the partitioning's columns (``part``), the schema changes the sinks' targets need
    (:func:`plan_changes`), then each sink's hook; on a ``log`` that holds no epoch, that
    no target remembers epochs of ``app_id``. Returns the planned changes by sink uid.
    ``path``: a path that does not evolve schemas (:func:`~txsink.spark.evolve.compare`)."""
    check_columns(part, schema.names)
    changes, seen = plan_changes(sinks, schema, app_id, path=path)
    fresh = log is not None and not log.epochs()
    for sink in sinks:
        check_sink(sink, seen.get(sink.uid, schema), app_id, log if fresh else None)
    return changes


def plan_changes(
    sinks: Sequence[SinkContract[Any, Any]],
    schema: pa.Schema,
    app_id: str,
    *,
    path: str | None = None,
) -> tuple[dict[str, SchemaChange], dict[str, pa.Schema]]:
    """The schema change each sink's target needs for an epoch of ``schema``: every sink
    evolves, or the epoch stops before anything is written (:mod:`txsink.schema`).

    Every sink's difference is compared first, and only then does any sink get ready for
    its change (``prepare_evolution``): a refusal of one sink never follows another's
    acceptance. Returns the changes by sink uid, and for each sink with a change the
    schema its own ``check`` is to see (the columns its target already has).
    """
    planned = _evolve.compare(sinks, schema, app_id, path=path)
    for sink, change in planned:
        _evolve.prepare(sink, change, app_id)
    changes = {sink.uid: change for sink, change in planned}
    return changes, {uid: _evolve.as_target_has(schema, c) for uid, c in changes.items()}


def _check_not_recorded(sink: SinkContract[Any, Any], app_id: str, log: TxLog) -> None:
    recorded = sink.recorded_epoch(app_id)
    if recorded is not None:
        raise ConfigurationError(
            f"the target already records epochs up to {recorded} of app {app_id!r} as "
            f"committed, but the txsink log at {log.location} holds no epoch: a new log "
            "numbers its epochs from 0 again, and they would be skipped as already written. "
            "Give a new pipeline a new app_id (or a new sink uid), or point log= at this "
            "app's own log (restore it from a savepoint if it was lost)",
            sink_uid=sink.uid,
            phase="check",
            connector=sink.connector,
        )


def arrow_schema(df: DataFrame) -> pa.Schema:
    """The DataFrame's schema as the sinks see it (Arrow; timestamps in the session's time
    zone where this PySpark converts in one, else in UTC:
    :func:`txsink.spark.versions.arrow_schema`).

    Only a column Arrow cannot carry is the user's to fix: PySpark refuses it with an error
    of its own condition (``UNSUPPORTED_DATA_TYPE_FOR_ARROW_CONVERSION``, on 3.5 and 4.x).
    Any other exception (a ``TypeError`` about an argument this PySpark does not take, say)
    is an :class:`~txsink.errors.InternalError` naming the versions: never advice about the
    user's data.
    """
    schema, tz = df.schema, df.sparkSession.conf.get("spark.sql.session.timeZone")
    try:
        return _versions.arrow_schema(schema, tz)
    except Exception as err:
        if not _unsupported_type(err):
            raise InternalError.of(err, "the Arrow schema of the DataFrame", phase="check") from err
        raise ConfigurationError(
            f"the DataFrame's schema cannot be written through Arrow: {err}. Cast or drop that "
            "column before the sink (e.g. to a string with to_json)",
            phase="check",
        ) from err


#: PySpark's error conditions for a column type that Arrow cannot carry (3.5 and 4.x).
_ARROW_TYPE_CONDITIONS = ("UNSUPPORTED_DATA_TYPE_FOR_ARROW", "DUPLICATED_FIELD_NAME_IN_ARROW")


def _unsupported_type(err: BaseException) -> bool:
    """Whether ``err`` is PySpark refusing a column of the user's schema (by its error
    condition, never by the message), rather than our call."""
    condition = spark_condition(err)
    return condition is not None and condition.startswith(_ARROW_TYPE_CONDITIONS)
