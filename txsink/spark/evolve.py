"""Planning an epoch's schema changes across a coordinator's sinks, on the driver, before
anything of the epoch is written (issue #41; the rules are :mod:`txsink.schema`'s).

Two passes, so a refusal never follows an acceptance: :func:`compare` asks every sink's
target for its schema and refuses (strict policy, a kind the target cannot take, a change
without promotion) before :func:`prepare` asks any sink to get ready. Every error names
the sink, the column and the fix: "nothing decided may fail" starts here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from txsink.errors import ConfigurationError, InternalError, TxsinkError
from txsink.schema import ADD, ColumnChange, SchemaChange, SchemaEvolutionError, diff

if TYPE_CHECKING:
    from txsink.contract import SinkContract

__all__ = ["as_target_has", "compare", "prepare"]

R = TypeVar("R")
_DOCS = "docs/schema-evolution.md"


def compare(
    sinks: Sequence[SinkContract[Any, Any]],
    schema: pa.Schema,
    app_id: str,
    *,
    path: str | None = None,
) -> list[tuple[SinkContract[Any, Any], SchemaChange]]:
    """Each sink whose target's schema differs from ``schema``, with its change; raises
    :class:`~txsink.schema.SchemaEvolutionError` for the first sink that will not take it.
    ``path``: the name of a path that cannot evolve schemas (the Data Source's
    ``format('txsink')``): any change is refused there, saying which path evolves."""
    planned = []
    for sink in sinks:
        target = _asked(sink, "reading its target's schema", _target_of(sink, app_id))
        if target is None:
            continue
        found = diff(target, schema)
        if found.refusals:
            raise _no_promotion(sink, found.refusals)
        if not found.changes:
            continue
        change = SchemaChange(sink.uid, target, found.merged, found.changes)
        if path is not None:
            raise _not_here(sink, change, path)
        if sink.schema_evolution == "strict":
            raise _strict(sink, change)
        support = sink.evolution_support()
        refused = [c for c in change.columns if c.kind not in support]
        if refused:
            raise _unsupported(sink, refused, support)
        planned.append((sink, change))
    return planned


def prepare(sink: SinkContract[Any, Any], change: SchemaChange, app_id: str) -> None:
    """``sink.prepare_evolution(change)`` with the context its errors carry."""
    _asked(
        sink,
        "checking its target can take the change",
        lambda: sink.prepare_evolution(change, app_id),
    )


def as_target_has(schema: pa.Schema, change: SchemaChange) -> pa.Schema:
    """The part of ``schema`` its sink's target already has, in the target's types: what
    the sink's own ``check`` judges (the rest is the change, judged by
    ``prepare_evolution``)."""
    added = {c.path[0] for c in change.added()}
    changed = {c.path[0] for c in change.columns if c.kind != ADD}
    return pa.schema(
        [
            change.old.field(f.name) if f.name in changed else f
            for f in schema
            if f.name not in added
        ],
        metadata=schema.metadata,
    )


def _asked(sink: SinkContract[Any, Any], doing: str, call: Callable[[], R]) -> R:
    ctx: dict[str, Any] = {"sink_uid": sink.uid, "phase": "check", "connector": sink.connector}
    try:
        return call()
    except TxsinkError as err:
        raise err.with_context(**ctx) from err.__cause__
    except (TypeError, AttributeError) as err:  # a call our code or a library misreads
        raise InternalError.of(err, f"sink {sink.uid!r} {doing}", **ctx) from err
    except Exception as err:  # a connector's gap: a library's error let through untyped
        text = str(err).strip().splitlines()
        raise ConfigurationError(
            f"sink {sink.uid!r} failed {doing} with {type(err).__name__}: "
            f"{text[0] if text else ''}. Fix the cause it names (the target, the sink's "
            "settings), then start again",
            **ctx,
        ) from err


def _error(sink: SinkContract[Any, Any], column: str, message: str) -> SchemaEvolutionError:
    return SchemaEvolutionError(
        message, sink_uid=sink.uid, column=column, phase="check", connector=sink.connector
    )


def _strict(sink: SinkContract[Any, Any], change: SchemaChange) -> SchemaEvolutionError:
    return _error(
        sink,
        change.columns[0].column,
        f"the epoch's schema differs from sink {sink.uid!r}'s target: it {change.describe()}. "
        "The sink's schema_evolution is 'strict', so nothing of the epoch was written. To "
        "evolve the targets in the epoch that brings the change, pass "
        "schema_evolution='add-columns' to every sink of the coordinator "
        f"({_DOCS}); or select and cast the columns to the target's schema before the sink",
    )


def _not_here(
    sink: SinkContract[Any, Any], change: SchemaChange, path: str
) -> SchemaEvolutionError:
    return _error(
        sink,
        change.columns[0].column,
        f"the epoch's schema differs from sink {sink.uid!r}'s target: it {change.describe()}, "
        f"and {path} does not evolve schemas. Nothing of the epoch was written. Run the "
        "query through foreachBatch(txsink.Coordinator(...)) with "
        f"schema_evolution='add-columns' to evolve the targets in the epoch ({_DOCS}), or "
        "cast the columns to the target's schema before the sink",
    )


def _unsupported(
    sink: SinkContract[Any, Any], refused: list[ColumnChange], support: frozenset[str]
) -> SchemaEvolutionError:
    takes = ", ".join(sorted(support)) or "no change of schema"
    return _error(
        sink,
        refused[0].column,
        f"sink {sink.uid!r} ({sink.connector}) cannot take this change in one commit with "
        f"the epoch's rows: it {'; '.join(c.describe() for c in refused)} (its target takes: "
        f"{takes}). Nothing of the epoch was written. Cast the column to the target's type "
        "before the sink, or change the target by hand with the query stopped "
        f"({_DOCS}, per target)",
    )


def _no_promotion(
    sink: SinkContract[Any, Any], refusals: Sequence[tuple[str, str]]
) -> SchemaEvolutionError:
    column, why = refusals[0]
    more = f" (and {', '.join(c for c, _ in refusals[1:])})" if len(refusals) > 1 else ""
    return _error(
        sink,
        column,
        f"column {column!r}{more} of the epoch cannot be written to sink {sink.uid!r}'s "
        f"target: {why}, a change no target takes without rewriting its rows, whatever "
        "the schema_evolution. Nothing of the epoch was written. Cast the column back to "
        f"the target's type before the sink, or write it as a new column ({_DOCS})",
    )


def _target_of(sink: SinkContract[Any, Any], app_id: str) -> Callable[[], pa.Schema | None]:
    return lambda: sink.target_schema(app_id)
