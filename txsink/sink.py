"""The base class connectors subclass: the contract, plus the drop-in ``foreachBatch(sink)``.

The hooks and their contracts are in :mod:`txsink.contract`; this module only adds
what makes a sink usable on its own, which needs the coordinator (so the contract
module stays free of it, and the coordinator depends on the contract, not the
reverse).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from txsink.contract import EpochCommit, EpochData, Partitioning, SinkContract, TaskInfo
from txsink.coordinator import Coordinator
from txsink.handles import Handle

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from txsink.log import LogStore

__all__ = ["EpochCommit", "EpochData", "Partitioning", "TaskInfo", "TwoPhaseCommitSink"]

T = TypeVar("T")
H = TypeVar("H", bound=Handle)


class TwoPhaseCommitSink(SinkContract[T, H]):
    """Base class of every txsink connector (the two-phase-commit template).

    The hooks are :class:`~txsink.contract.SinkContract`'s. Given ``log=``, a sink is
    also usable on its own as ``writeStream.foreachBatch(sink)``: it builds a one-sink
    :class:`~txsink.Coordinator` (with ``coordinator_options``) on first use.
    """

    def __init__(
        self, uid: str, *, log: str | LogStore | None = None, **coordinator_options: Any
    ) -> None:
        super().__init__(uid)
        self._log_location = log
        self._coordinator_options = coordinator_options
        self._coordinator: Coordinator | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` entry point for a sink used on its own (needs ``log=``)."""
        if self._coordinator is None:
            if self._log_location is None:
                raise TypeError(
                    f"{type(self).__name__}(uid={self.uid!r}) was used as foreachBatch(sink) "
                    "without log=...: pass log='<path or URL of the txsink log>' or wrap it "
                    "in txsink.Coordinator([sink], log=...)"
                )
            self._coordinator = Coordinator(
                [self], log=self._log_location, **self._coordinator_options
            )
        self._coordinator(df, batch_id)

    def __getstate__(self) -> dict[str, Any]:
        # Sinks travel to executors inside the task closure; the coordinator and the log
        # (a store may hold credentials and refuse pickling) stay on the driver.
        state = self.__dict__.copy()
        state["_coordinator"] = None
        state["_log_location"] = None
        return state
