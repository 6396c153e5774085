"""Streams whose schema changes mid-stream, for the schema-evolution tests (issue #41): the
per-epoch transforms ``txsink.testing.pipelines.run_stream(transform=...)`` loads by path
(``integration/evolving.py:gains_a_column``), in the query's own process.

The input is the chaos input (``id long, key string, amount double, payload string``, one
file per epoch); from :data:`ADDED_AT` on, each epoch has a new column ``note``
(``n<id>``), as when an upstream team adds a field; :func:`gains_and_widens` also has an
integer ``qty`` that is ``int`` before :data:`WIDENED_AT` and ``long`` from it on.
"""

from __future__ import annotations

from typing import Any

#: The first epoch with the column ``note``.
ADDED_AT = 2
#: The first epoch whose ``qty`` is a long.
WIDENED_AT = 3


def note_of(row_id: int) -> str:
    return f"n{row_id}"


def gains_a_column(df: Any, batch_id: int) -> Any:
    from pyspark.sql import functions as F

    if batch_id >= ADDED_AT:
        df = df.withColumn("note", F.concat(F.lit("n"), F.col("id").cast("string")))
    return df


def gains_and_widens(df: Any, batch_id: int) -> Any:
    from pyspark.sql import functions as F

    qty = (F.col("id") % 1000).cast("long" if batch_id >= WIDENED_AT else "int")
    return gains_a_column(df.withColumn("qty", qty), batch_id)
