"""Streaming queries metered epoch by epoch: a ``StreamingQueryListener`` that records, at
each epoch's progress event, the time and a CPU snapshot (:class:`~.cpu.CpuMeter`).

Spark posts an epoch's progress event right after the epoch's batch ends, so the
difference of two epochs' snapshots is the CPU the epochs between them cost, by role, with
the query's start-up (and whichever first epochs a benchmark leaves out) outside it. The
listener's own cost (a ``/proc`` scan per epoch, in the driver) is the same for every
writer of a run. Used by ``kafka_steady`` and ``datasource``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .cpu import CpuMeter


@dataclass
class Epoch:
    """One epoch's progress event: its records, Spark's own duration, when the listener
    saw it and the CPU snapshot it took."""

    batch: int
    rows: int
    trigger_s: float
    at: float
    cpu: dict[str, float]


@dataclass
class Meter:
    """The epochs of one query, filled by the listener (Spark's listener thread)."""

    name: str
    epochs: dict[int, Epoch] = field(default_factory=dict)
    seen: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, batch: int, timeout_s: float = 60.0) -> bool:
        """Wait until the progress event of ``batch`` arrived (events come asynchronously)."""
        with self.seen:
            return self.seen.wait_for(lambda: batch in self.epochs, timeout_s)


def listener(cpu: CpuMeter, meters: dict[str, Meter]) -> Any:
    """A listener that records every epoch of the queries in ``meters`` (by query name,
    known before the query starts, so no epoch's event can come before its meter)."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class EpochListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            snap = cpu.snapshot()  # first: as close to the epoch's end as we get
            at = time.perf_counter()
            progress = event.progress
            meter = meters.get(str(progress.name))
            if meter is None or progress.numInputRows == 0:
                return
            epoch = Epoch(
                int(progress.batchId),
                int(progress.numInputRows),
                float(progress.durationMs.get("triggerExecution", 0)) / 1000,
                at,
                snap,
            )
            with meter.seen:
                meter.epochs[epoch.batch] = epoch
                meter.seen.notify_all()

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return EpochListener()
