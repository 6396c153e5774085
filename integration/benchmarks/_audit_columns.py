"""The row digest per column type, in one Python process without Spark (``run audit``'s
last table): CPU-seconds per million values of ``digest_batch`` over a one-column batch of
each column of the audit benchmark's schema, and of ``pyarrow.parquet.write_table`` of the
same batch (what the files sink does with it) as the yardstick.

CPU is the process's (``time.process_time``: every thread, Arrow's pool included), the
best of a few tries, so a busy machine moves it little.
"""

from __future__ import annotations

import decimal
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from txsink.audit.digest import digest_batch

TRIES = 3


def batch(rows: int, schema: pa.Schema | None = None) -> pa.RecordBatch:
    """The audit benchmark's columns for ids ``0..rows-1``, the same values its Spark SQL
    makes (``audit.COLUMNS``), cast to ``schema`` (the Arrow schema the Spark run's tasks
    saw, read back from its output) if given."""
    ids = np.arange(rows, dtype=np.int64)
    cents = ids % 10_000_000
    names = np.char.add("user-", np.char.zfill(cents.astype(str), 7)).astype(object)
    categories = np.array(["books", "games", "food", "tools", "toys"], dtype=object)[ids % 5]
    prices = [decimal.Decimal(int(c)).scaleb(-2) for c in cents]
    out = pa.record_batch(
        {
            "id": pa.array(ids),
            "name": pa.array(names, pa.string()),
            "amount": pa.array(ids.astype(np.float64) * 0.37),
            "ts": pa.array((1_700_000_000 + ids) * 1_000_000).cast(pa.timestamp("us", "UTC")),
            "price": pa.array(prices, pa.decimal128(12, 2)),
            "category": pa.array(categories, pa.string()),
        }
    )
    if schema is None or schema.names != out.schema.names:
        return out
    return out.cast(schema.remove_metadata())


def cpu_s(fn: Callable[[], Any]) -> float:
    """The best of :data:`TRIES` runs' CPU seconds (this process, every thread)."""
    best = float("inf")
    for _ in range(TRIES):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def measure(rows: int, schema: pa.Schema | None = None) -> dict[str, Any]:
    """``{"rows", "types", "digest", "parquet"}``: per column (and ``"all"``, the whole
    batch) CPU-seconds per million values of the digest and of the Parquet write."""
    data = batch(rows, schema)
    per_m = 1e6 / rows
    digest_batch(data.slice(0, 8))  # the compiled loops' first call (from numba's cache)
    digest: dict[str, float] = {}
    parquet: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="txsink-bench-audit-columns-") as folder:
        path = Path(folder) / "batch.parquet"
        for name in [*data.schema.names, "all"]:
            one = data if name == "all" else data.select([name])
            table = pa.Table.from_batches([one])
            digest[name] = cpu_s(functools.partial(digest_batch, one)) * per_m
            write = functools.partial(pq.write_table, table, path, compression="snappy")
            parquet[name] = cpu_s(write) * per_m
    return {
        "rows": rows,
        "types": {n: str(data.schema.field(n).type) for n in data.schema.names},
        "digest": digest,
        "parquet": parquet,
        "startup": startup_cpu(),
    }


#: A fresh Python process: numba's import, then the first digest (the compiled loops
#: loaded from numba's cache), each as CPU seconds.
_STARTUP = """
import time, pyarrow as pa
t = time.process_time()
import numba
imported = time.process_time() - t
from txsink.audit.digest import digest_batch
batch = pa.record_batch({"i": [1, None], "s": ["a", None], "f": [1.5, 2.5]})
t = time.process_time()
digest_batch(batch)
print(imported, time.process_time() - t)
"""


def startup_cpu() -> dict[str, float]:
    """What a new Python worker process pays once before its first digest (the best of
    :data:`TRIES` fresh processes): ``import`` (numba) and ``first`` (the loops loaded)."""
    import subprocess
    import sys

    best = {"import": float("inf"), "first": float("inf")}
    for _ in range(TRIES):
        out = subprocess.run(
            [sys.executable, "-c", _STARTUP], capture_output=True, text=True, check=True
        ).stdout.split()
        best = {
            "import": min(best["import"], float(out[0])),
            "first": min(best["first"], float(out[1])),
        }
    return best
