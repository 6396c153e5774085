"""Deterministic test input: a file stream whose file ``i`` is epoch ``i``.

Every test pipeline of the toolkit (the demo, chaos runs, the soak, the integration
suite) reads Parquet files of :data:`INPUT_SCHEMA` with ``maxFilesPerTrigger=1``; the
ids are unique, so a verifier can count duplicates and missing rows exactly.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["INPUT_SCHEMA", "append_input", "input_epochs", "make_input"]

#: The schema of every input file, as a Spark DDL string.
INPUT_SCHEMA = "id long, key string, amount double, payload string"


def _table(ids: range) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "key": pa.array([f"k{n % 97}" for n in ids]),
            "amount": pa.array([(n * 7919 % 100000) / 100 for n in ids], pa.float64()),
            "payload": pa.array([f"event-{n:09d}" for n in ids]),
        }
    )


def make_input(folder: str | os.PathLike[str], rows: int, files: int) -> None:
    """``files`` Parquet files holding ids ``0..rows-1``.

    File ``i`` gets an older modification time than file ``i+1``, so a file
    stream with ``maxFilesPerTrigger=1`` reads file ``i`` as epoch ``i``.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    per = -(-rows // files)
    for i in range(files):
        lo, hi = i * per, min(rows, (i + 1) * per)
        if lo >= hi:
            break
        path = root / f"input-{i:04d}.parquet"
        pq.write_table(_table(range(lo, hi)), path)
        # Spark's file source takes files in modification-time order; files written
        # within the same second would make "file i = epoch i" a coin toss.
        stamp = time.time() - (files - i) * 10
        os.utime(path, (stamp, stamp))


def append_input(
    folder: str | os.PathLike[str], first_id: int, rows: int, first_file: int, files: int = 1
) -> None:
    """More files after the existing ones (newer modification times, new ids)."""
    per = -(-rows // files)
    for i in range(files):
        ids = range(first_id + i * per, first_id + min(rows, (i + 1) * per))
        path = Path(folder) / f"input-{first_file + i:04d}.parquet"
        pq.write_table(_table(ids), path)
        stamp = time.time() + i
        os.utime(path, (stamp, stamp))


def input_epochs(folder: str | os.PathLike[str], id_column: str = "id") -> dict[int, list[int]]:
    """Epoch -> ids of a file-stream input read one file per epoch (``maxFilesPerTrigger=1``).

    Files are taken in the order Spark's file source takes them (modification time, then
    name), as :func:`make_input` writes them: file ``i`` is epoch ``i``.
    """
    files = sorted(
        (p for p in Path(folder).iterdir() if p.suffix == ".parquet"),
        key=lambda p: (p.stat().st_mtime, p.name),
    )
    return {
        i: [
            int(v)
            for v in pq.read_table(p, columns=[id_column], use_threads=False, pre_buffer=False)
            .column(0)
            .to_pylist()
        ]
        for i, p in enumerate(files)
    }
