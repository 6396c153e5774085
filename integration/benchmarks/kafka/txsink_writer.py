"""txsink's KafkaSink in its three modes, through the whole protocol:
``Coordinator([KafkaSink(mode=..., key="key", value="value")]).write(df, epoch=0)``.

direct  tasks produce into open transactions, vote, and commit on the decision
        (``shards=max(8, partitions)``);
wal     tasks write an Arrow IPC WAL file and fsync it; a commit job (one task per shard,
        ``shards=partitions``) produces it with the shard's marker;
replay  the epoch resharded by the key's hash and persisted; tasks count and checksum their
        shard; the commit job re-reads it and produces (``shards=partitions``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from txsink import Coordinator
from txsink.connectors.kafka.sink import KafkaSink

from .context import Bench
from .profiled import ProfiledKafkaSink

TXN_PREFIX = "txsink-bench"


def mode_options(mode: str, wal: Path, partitions: int) -> dict[str, Any]:
    """KafkaSink's options for ``mode`` in the benchmarks (the one-shot and the steady
    state alike): WAL and replay one commit task per partition, direct ``max(8, p)`` shards."""
    kwargs: dict[str, Any] = {
        "key": "key",
        "value": "value",
        "transactional_id_prefix": TXN_PREFIX,
    }
    if mode == "wal":
        kwargs.update(mode="wal", wal=wal, shards=partitions)  # one commit task per partition
    elif mode == "direct":
        kwargs.update(mode="direct", shards=max(8, partitions))
    else:
        kwargs.update(mode="replay", shards=partitions)
    return kwargs


def _sink(
    bench: Bench, mode: str, topic: str, uid: str, wal: Path, partitions: int, profile_dir: str
) -> KafkaSink:
    kwargs = {**mode_options(mode, wal, partitions), "marker_topic": bench.marker_topic}
    if profile_dir:
        return ProfiledKafkaSink(bench.bootstrap, topic, uid, profile_dir=profile_dir, **kwargs)
    return KafkaSink(bench.bootstrap, topic, uid, **kwargs)


def write_txsink(
    bench: Bench, mode: str, df: Any, topic: str, partitions: int, profile_dir: str = ""
) -> dict[str, Any]:
    uid = topic.removeprefix("txsink-bench-")  # unique per run: markers are per app/uid/shard
    with tempfile.TemporaryDirectory(dir=bench.workdir, prefix=f"{mode}-") as tmp:
        wal = Path(tmp, "wal")
        sink = _sink(bench, mode, topic, uid, wal, partitions, profile_dir)
        coordinator = Coordinator([sink], log=Path(tmp, "log"), app_id=f"bench-{bench.run_id}")
        result = coordinator.write(df, epoch=0)
        leftover = sum(1 for _ in wal.rglob("*.arrow")) if wal.exists() else 0
    if result.status != "committed":
        raise RuntimeError(f"txsink epoch not committed: {result}")
    return {"phases": dict(result.seconds), "handles": result.handles, "wal_left": leftover}
