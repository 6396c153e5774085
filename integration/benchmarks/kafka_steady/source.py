"""The steady-state input: every epoch's records as Parquet files written before any query
runs, and the stream that hands them to a query one epoch per micro-batch."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks import _bench
from benchmarks.kafka import records

#: Spark packs small files into one partition unless opening a file "costs" more than a
#: partition holds: with this, every file is a partition of its own (one task per file).
SESSION_CONF = {"spark.sql.files.openCostInBytes": str(1 << 30)}


def write_epochs(spark: Any, folder: Path, epochs: int, rows: int, partitions: int) -> Path:
    """``epochs`` epochs of ``rows`` records (ids ``e * rows`` onwards for epoch ``e``), each
    ``partitions`` Parquet files by the key's hash, in ``folder/source``; their modification
    times one second apart per epoch, so the stream takes them in epoch order."""
    source = folder / "source"
    source.mkdir(parents=True)
    base = time.time() - epochs - 10
    for epoch in range(epochs):
        staging = folder / f"staging-{epoch}"
        (
            spark.range(epoch * rows, (epoch + 1) * rows, 1, 2)
            .selectExpr(*records.EXPRS)
            .repartition(partitions, "key")
            .write.parquet(str(staging))
        )
        parts = sorted(staging.glob("part-*.parquet"))
        if len(parts) != partitions:
            raise RuntimeError(
                f"epoch {epoch}: {len(parts)} files for {partitions} partitions (an empty "
                "hash partition?): use more --rows"
            )
        for i, part in enumerate(parts):
            target = source / f"epoch-{epoch:05d}-{i:03d}.parquet"
            part.rename(target)
            os.utime(target, (base + epoch, base + epoch))
        shutil.rmtree(staging)
    _bench.log(f"wrote {epochs} epochs of {rows:,} records in {partitions} files each")
    return source


def fingerprint(spark: Any, source: Path) -> tuple[int, ...]:
    """The records' fingerprint (count, key/value bytes, CRC32 sums), as the one-shot
    benchmark checks a topic against."""
    return records.spark_fingerprint(spark.read.parquet(str(source)))


def stream(spark: Any, source: Path, partitions: int) -> Any:
    """The streaming frame every writer reads: one epoch (``partitions`` files) per batch."""
    schema = spark.read.parquet(str(source)).schema
    return (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", partitions)
        .parquet(str(source))
        .select("key", "value")
    )
