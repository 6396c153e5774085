"""The run's context every writer, check and extra of the Kafka benchmark shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import _bench


@dataclass
class Bench:
    """The Spark session, the broker, the CPU meter, the topics alive (deleted at the end
    if a run could not) and the void runs' messages."""

    spark: Any
    bootstrap: str
    topic_partitions: int
    workdir: Path
    cpu: _bench.CpuMeter
    run_id: str
    marker_topic: str
    topics: list[str] = field(default_factory=list)
    void: list[str] = field(default_factory=list)
