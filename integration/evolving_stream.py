"""A streaming query whose rows change shape mid-stream, into an Iceberg table on a local
SQL catalog (SQLite) and a local warehouse: the input of ``integration/test_evolve_iceberg.py``.

The file stream of :func:`txsink.testing.inputs.make_input` (one file per epoch) is shaped
per epoch in ``foreachBatch``, as an upstream team's change would reach the sink: before
epoch :data:`EVOLVES_AT` ``(id long, amount int, price decimal(10,2), payload
struct<a string>)``; from it on, ``amount`` is a long, ``price`` a decimal(12,2),
``payload`` gains ``b int`` and a column ``note string`` comes. A replayed epoch gets the
same shape (it depends on the epoch id only).

:func:`run` is the child-process pipeline the kill-driver cells restart
(``python -m txsink.runner integration/evolving_stream.py:run '{"workdir": ...}'``; the
fault plan comes from ``TXSINK_FAULT``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TABLE, UID, CATALOG = "ns.evo", "ice", "txsink"
EVOLVES_AT = 1
#: Added to every amount from EVOLVES_AT on: a value only a long holds.
BIG = 2**40
INPUT_SCHEMA = "id long, key string, amount double, payload string"


def catalog_properties(workdir: str | Path) -> dict[str, str]:
    """The local catalog and warehouse under ``workdir``."""
    return {
        "type": "sql",
        "uri": f"sqlite:///{Path(workdir, 'catalog.db')}",
        "warehouse": Path(workdir, "warehouse").as_uri(),
    }


def iceberg_sink(
    workdir: str | Path,
    policy: str = "add-columns",
    *,
    catalog: dict[str, str] | None = None,
    catalog_name: str = CATALOG,
    table: str = TABLE,
) -> Any:
    """The sink, creating ``table`` from the first epoch's schema; on the local catalog
    under ``workdir`` unless given another ``catalog`` (pyiceberg properties)."""
    from txsink.connectors.iceberg import IcebergSink

    if catalog is None:
        Path(workdir, "warehouse").mkdir(parents=True, exist_ok=True)
        catalog = catalog_properties(workdir)
    return IcebergSink(
        catalog, table, uid=UID, catalog_name=catalog_name, create=True, schema_evolution=policy
    )


def shape(df: Any, epoch: int) -> Any:
    """The batch of ``epoch`` in that epoch's shape (module doc)."""
    from pyspark.sql import functions as F

    key, amount = F.col("key"), F.col("amount")
    if epoch < EVOLVES_AT:
        return df.select(
            "id",
            amount.cast("int").alias("amount"),
            amount.cast("decimal(10,2)").alias("price"),
            F.struct(key.alias("a")).alias("payload"),
        )
    return df.select(
        "id",
        (amount.cast("long") + F.lit(BIG)).alias("amount"),
        (amount + F.lit(10**9)).cast("decimal(12,2)").alias("price"),
        F.struct(key.alias("a"), (F.col("id") % 7).cast("int").alias("b")).alias("payload"),
        F.concat(F.lit("n"), F.col("id").cast("string")).alias("note"),
    )


class Evolving:
    """``foreachBatch``: the coordinator, called with each batch in its epoch's shape."""

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator

    def __call__(self, df: Any, batch_id: int) -> None:
        self.coordinator(shape(df, int(batch_id)), batch_id)

    def close(self) -> None:
        self.coordinator.close()


def start(spark: Any, workdir: str | Path, batch: Evolving) -> Any:
    """The query: the input folder, one file per epoch, into ``batch``."""
    return (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(Path(workdir, "input")))
        .repartition(2, "id")
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(Path(workdir, "checkpoint")))
        .trigger(availableNow=True)
        .start()
    )


def run(workdir: str, policy: str = "add-columns") -> None:
    """The pipeline in a child process, until the input is done (faults: ``TXSINK_FAULT``)."""
    from txsink import Coordinator
    from txsink.protocol.faults import FaultPlan
    from txsink.spark.localspark import local_spark

    coordinator = Coordinator(
        [iceberg_sink(workdir, policy)],
        log=str(Path(workdir, "txlog")),
        faults=FaultPlan.from_env(),
    )
    spark = local_spark("local[2]", "txsink-evolving-stream")
    try:
        start(spark, workdir, Evolving(coordinator)).awaitTermination()
    finally:
        coordinator.close()
        spark.stop()
