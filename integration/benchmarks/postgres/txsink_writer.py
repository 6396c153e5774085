"""txsink's PostgresSink through the whole protocol:
``Coordinator([PostgresSink(mode="append")]).write(df, epoch=0)`` (or ``mode="upsert",
key=["id"]``); and its subclass that times its hooks for the profile run.

The profiled sink is pickled into Spark's tasks: this module is shipped by value
(``_bench.pickle_by_value``) and its sink must not use ``_bench``.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from typing_extensions import override

from txsink import Coordinator
from txsink.connectors.postgres.copy import OpenTxn
from txsink.connectors.postgres.sink import PostgresSink
from txsink.handles import Handle
from txsink.txid import TxnId

from .context import Bench


class ProfiledPostgresSink(PostgresSink):
    """PostgresSink that writes, per task, the seconds spent in begin / write / prepare.

    Used only for the profile run (its numbers are not in the throughput table). ``feed``
    in the profile is the task's time between its first ``begin`` and the end of
    ``prepare`` not spent in the sink: Spark producing and shipping the batches.
    """

    def __init__(self, *args: Any, profile_dir: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profile_dir = profile_dir
        self._profile: dict[str, float] = {}

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> OpenTxn:
        t0 = time.perf_counter()
        opened = super().begin(txn, schema)
        self._profile = {"start": t0, "begin": time.perf_counter() - t0, "write": 0.0}
        return opened

    @override
    def write(self, txn: OpenTxn, batch: pa.RecordBatch) -> None:
        t0 = time.perf_counter()
        super().write(txn, batch)
        self._profile["write"] += time.perf_counter() - t0

    @override
    def prepare(self, txn: OpenTxn) -> Handle:
        t0 = time.perf_counter()
        handle = super().prepare(txn)
        end = time.perf_counter()
        p = self._profile
        record = {
            "partition": txn.txn.partition,
            "rows": handle.rows,
            "begin": p["begin"],
            "write": p["write"],
            "prepare": end - t0,
            "span": end - p["start"],
        }
        Path(self.profile_dir, f"{txn.txn}.json").write_text(json.dumps(record))
        return handle


def write_txsink(
    bench: Bench,
    df: Any,
    table: str,
    profile_dir: str | None = None,
    *,
    upsert: bool = False,
    commit: Literal["2pc", "staging"] = "2pc",
) -> dict[str, Any]:
    """One epoch through the whole protocol; ``commit``: the sink's (``2pc``, ``staging``).
    ``lingering``: prepared transactions, or staging rows, of this sink left afterwards."""
    from txsink.connectors.postgres.testing import staged_names

    uid = table.replace("_", "-")
    kwargs: dict[str, Any] = {"mode": "upsert", "key": ["id"]} if upsert else {"mode": "append"}
    kwargs["commit"] = commit
    target = bench.qualified(table)
    sink: PostgresSink = (
        ProfiledPostgresSink(bench.dsn, target, uid, profile_dir=profile_dir, **kwargs)
        if profile_dir is not None
        else PostgresSink(bench.dsn, target, uid, **kwargs)
    )
    with tempfile.TemporaryDirectory(dir=bench.workdir) as log:
        result = Coordinator([sink], log=log, app_id="bench").write(df, epoch=0)
    if result.status != "committed":
        raise RuntimeError(f"txsink epoch not committed: {result}")
    with bench.connect() as conn:
        prepared = conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%.{uid}.%",)
        ).fetchone()
        staged = staged_names(conn, target, f"txsink.bench.{uid}.")
    return {
        "phases": dict(result.seconds),
        "handles": result.handles,
        "lingering": (int(prepared[0]) if prepared else -1) + len(staged),
    }
