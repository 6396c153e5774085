"""Step 4 of an epoch: write its decision, the commit point; or lose it and say so.

One place for it because two callers decide: the coordinator after a pre-commit job
returned, and the vote service while a single-pass job's tasks wait with their
transactions open (:mod:`txsink.protocol.votes`). Both write the same record, with the same
rounds and voids, so a zombie driver stays fenced whichever way the epoch ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from txsink.contract import SinkContract
from txsink.errors import FencedError
from txsink.handles import Handle, dump_handle
from txsink.observe.logs import EpochLogger
from txsink.observe.metering import Meter
from txsink.protocol.commit import abort_one
from txsink.protocol.log import TxLog
from txsink.schema import SchemaChange, schema_to_json

__all__ = ["decide_epoch"]


def decide_epoch(
    log: TxLog,
    sinks: Sequence[SinkContract[Any, Any]],
    epoch: int,
    round_: int,
    handles: Mapping[str, Sequence[Handle]],
    *,
    rows: Mapping[str, int],
    seconds: Mapping[str, float] | None = None,
    logger: EpochLogger,
    meter: Meter | None = None,
    schema: Mapping[str, SchemaChange] | None = None,
    rows_schema: pa.Schema | None = None,
) -> None:
    """Void the epoch's earlier rounds, then create round ``round_``'s decision (with
    ``schema``: the schema change each sink applies in this epoch's commit; ``rows_schema``:
    the rows' Arrow schema, kept in its stats as ``"schema"`` for the audit).

    Raises :class:`~txsink.errors.FencedError`, after aborting ``handles``, when another
    driver decided an earlier round or voided this one: its decision stands.
    """
    for earlier in range(round_):
        if log.void(epoch, earlier, f"superseded by round {round_}") is not None:
            _lost(
                sinks,
                epoch,
                round_,
                handles,
                why=f"round {earlier} was decided by another driver",
                logger=logger,
                meter=meter,
            )
    docs = {uid: [dump_handle(h) for h in hs] for uid, hs in handles.items()}
    stats: dict[str, Any] = {"rows": dict(rows)}
    if seconds:
        stats["seconds"] = {k: round(v, 6) for k, v in seconds.items()}
    if rows_schema is not None:
        stats["schema"] = schema_to_json(rows_schema)["arrow"]
    changes = {uid: change.to_json() for uid, change in (schema or {}).items()}
    if not log.decide(epoch, round_, docs, stats, changes):
        _lost(
            sinks,
            epoch,
            round_,
            handles,
            why=f"round {round_} was voided by another driver",
            logger=logger,
            meter=meter,
        )


def _lost(
    sinks: Sequence[SinkContract[Any, Any]],
    epoch: int,
    round_: int,
    handles: Mapping[str, Sequence[Handle]],
    *,
    why: str,
    logger: EpochLogger,
    meter: Meter | None = None,
) -> None:
    for sink in sinks:
        for handle in handles.get(sink.uid, ()):
            abort_one(sink, handle, f"this driver lost epoch {epoch}", log=logger, meter=meter)
    raise FencedError(
        f"this driver lost epoch {epoch} (its round {round_}): {why}. Its transactions "
        "were aborted; the other driver's decision stands. Another query is writing "
        "with the same txsink log: stop one of them",
        epoch=epoch,
        phase="decide",
    )
