"""A batch of Kafka records as Python objects, converted once.

The produce loop needs each record's topic, key and value as Python ``str``/``bytes``, and
the replay checksum (version 3) hashes the same objects: a replay commit task converts
each batch once (:func:`py_columns`) and hands the result to both. The conversion, not
the hashing, is what costs (about 0.2 s per million 200-byte values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["PyColumns", "constant", "py_columns"]


@dataclass(frozen=True)
class PyColumns:
    """The topic, key and value of each record of a batch, as object arrays
    (``numpy.ndarray`` of ``str``/``bytes``/``None``); ``topic`` is set when every record
    goes to that one topic, and ``topics`` is None then."""

    rows: int
    topic: str | None
    topics: Any
    keys: Any
    values: Any


def py_columns(records: pa.RecordBatch) -> PyColumns:
    """``records`` (:data:`~txsink.connectors.kafka.records.format.RECORD_SCHEMA`) as
    Python objects."""
    topic_col, _, key_col, value_col, _ = records.columns
    topic = constant(topic_col)
    return PyColumns(
        rows=records.num_rows,
        topic=topic,
        topics=None if topic is not None else topic_col.to_numpy(zero_copy_only=False),
        keys=key_col.to_numpy(zero_copy_only=False),
        values=value_col.to_numpy(zero_copy_only=False),
    )


def constant(arr: pa.Array) -> Any:
    """The one value of every slot of ``arr`` (no nulls), else None; cheap (Arrow compute)."""
    if len(arr) == 0 or arr.null_count:
        return None
    first = arr[0]
    return first.as_py() if pc.all(pc.equal(arr, first)).as_py() else None
