"""The base class connectors subclass: the contract, plus the drop-in ``foreachBatch(sink)``.

The hooks and their contracts are in :mod:`txsink.contract`; this module only adds
what makes a sink usable on its own, which needs the coordinator (so the contract
module stays free of it, and the coordinator depends on the contract, not the
reverse): ``foreachBatch(sink)``, and :func:`check` of a coordinator or such a sink
before the query starts.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypeVar

from txsink.contract import EpochCommit, EpochData, Partitioning, SinkContract, TaskInfo
from txsink.coordinator import Coordinator
from txsink.errors import ConfigurationError
from txsink.handles import Handle
from txsink.observe.logs import failures_logged, get_logger
from txsink.schema import Policy
from txsink.spark.remote import location_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from txsink.ops.precheck import CheckResult
    from txsink.store import LogStore

__all__ = [
    "EpochCommit",
    "EpochData",
    "Partitioning",
    "TaskInfo",
    "TwoPhaseCommitSink",
    "check",
]

T = TypeVar("T")
H = TypeVar("H", bound=Handle)


class TwoPhaseCommitSink(SinkContract[T, H]):
    """Base class of every txsink connector (the two-phase-commit template).

    The hooks are :class:`~txsink.contract.SinkContract`'s. Given ``log=``, a sink is
    also usable on its own as ``writeStream.foreachBatch(sink)``: it builds a one-sink
    :class:`~txsink.Coordinator` (with ``coordinator_options``) on first use.

    ``schema_evolution``: ``"strict"`` (the default: an epoch whose schema differs from
    the target's stops before writing) or ``"add-columns"`` (docs/schema-evolution.md).
    """

    def __init__(
        self,
        uid: str,
        *,
        log: str | LogStore | None = None,
        schema_evolution: Policy = "strict",
        **coordinator_options: Any,
    ) -> None:
        super().__init__(uid, schema_evolution=schema_evolution)
        self._log_location = log
        self._coordinator_options = coordinator_options
        self._coordinator: Coordinator | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` entry point for a sink used on its own (needs ``log=``)."""
        with failures_logged(get_logger(__name__, uid=self.uid), epoch=int(batch_id)):
            coordinator = self.coordinator()
        coordinator(df, batch_id)  # logs its own failures

    def coordinator(self) -> Coordinator:
        """The one-sink coordinator of the drop-in use (made on first use, from ``log=``).

        Raises :class:`~txsink.errors.ConfigurationError` for a sink without ``log=``.
        """
        if self._coordinator is None:
            if self._log_location is None:
                raise ConfigurationError(
                    f"{type(self).__name__}(uid={self.uid!r}) was used as foreachBatch(sink) "
                    "without log=...: pass log='<path or URL of the txsink log>' or wrap it "
                    "in txsink.Coordinator([sink], log=...)",
                    sink_uid=self.uid,
                    phase="check",
                    connector=self.connector,
                )
            self._coordinator = Coordinator(
                [self], log=self._log_location, **self._coordinator_options
            )
        return self._coordinator

    def __getstate__(self) -> dict[str, Any]:
        # Sinks travel to executors inside the task closure; the coordinator and a log
        # store (it may hold credentials and refuse pickling) stay on the driver. A log
        # location travels: Spark Connect runs foreachBatch(sink) in its server's process.
        state = self.__dict__.copy()
        state["_coordinator"] = None
        state["_log_location"] = location_of(self._log_location)
        return state


def check(
    df: DataFrame,
    pipeline: Coordinator | TwoPhaseCommitSink[Any, Any],
    *,
    checkpoint: str | os.PathLike[str] | None = None,
) -> list[CheckResult]:
    """Check a pipeline before ``start()``: ``txsink.check(df, coordinator_or_sink)``.

    ``pipeline`` is what the query passes to ``foreachBatch``: a
    :class:`~txsink.Coordinator`, or a sink used on its own (which needs ``log=``: one
    without it raises the :class:`~txsink.errors.ConfigurationError` its first batch
    would). Runs :meth:`Coordinator.check`: returns the checks, raises the first failure.
    """
    if isinstance(pipeline, TwoPhaseCommitSink):
        pipeline = pipeline.coordinator()
    if not isinstance(pipeline, Coordinator):
        raise TypeError(
            f"txsink.check() takes a Coordinator or a sink, got {type(pipeline).__name__}"
        )
    return pipeline.check(df, checkpoint=checkpoint)
