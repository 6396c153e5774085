"""The run's context every writer and check of the S3 benchmark shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import _bench

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@dataclass
class Bench:
    """The Spark session, the S3 client and the run's bucket, the CPU meter and the void
    runs' messages."""

    spark: Any
    client: S3Client
    bucket: str
    cpu: _bench.CpuMeter
    workdir: Path
    void: list[str] = field(default_factory=list)
