"""Issue 34, points 2 and 3, on the real servers: a decided epoch the broker refuses for
good is *blocked* (shown, fixed, finished by ``txsink recover`` exactly once), and
the driver lease (two live drivers on one log).

Read back with a confluent-kafka ``read_committed`` consumer (integration/readback.py),
not with txsink.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from readback import open_transactions, read_topic

from tests.memsink import memory_precommit
from txsink import Coordinator
from txsink.errors import InjectedFault
from txsink.faults import FaultPlan
from txsink.log import open_log
from txsink.verify import count_ids

pytestmark = [pytest.mark.kafka]
APP = "lease-app"


def _set_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def _pipeline(tmp_path: Path, bootstrap: str, topic: str, uid: str) -> str:
    """A pipeline file as an operator's ``txsink recover --pipeline`` loads it."""
    path = tmp_path / "pipeline.py"
    path.write_text(
        textwrap.dedent(
            f"""
            from txsink import Coordinator
            from txsink.connectors.kafka import KafkaSink

            def build():
                sink = KafkaSink({bootstrap!r}, {topic!r}, uid={uid!r}, key="key",
                                 wal={str(tmp_path / "wal")!r}, shards=2)
                return Coordinator([sink], log={str(tmp_path / "log")!r}, app_id={APP!r})
            """
        )
    )
    return f"{path}:build"


def _txsink(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txsink.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _batches(ids: range, big: int | None) -> list[list[pa.RecordBatch]]:
    """Two partitions of rows ``{"id", "key", "pad"}``; row ``big`` carries 60 KB that no
    compression makes smaller than 20 KB."""
    half = len(ids) // 2
    noise = base64.b64encode(os.urandom(45_000)).decode()
    out = []
    for part in (ids[:half], ids[half:]):
        pad = [noise if i == big else "" for i in part]
        out.append(
            [
                pa.RecordBatch.from_pydict(
                    {"id": list(part), "key": [f"k{i}" for i in part], "pad": pad}
                )
            ]
        )
    return out


def _ids(bootstrap: str, topic: str) -> list[int]:
    return sorted(json.loads(r.value or b"null")["id"] for r in read_topic(bootstrap, topic))


def test_a_topic_limit_lowered_after_the_decision_blocks_the_epoch_until_fixed(
    kafka: Any, tmp_path: Path
) -> None:
    from txsink.connectors.kafka import KafkaSink

    topic = kafka.new_topic(2)
    uid = "blk" + uuid.uuid4().hex[:8]
    pipeline = _pipeline(tmp_path, kafka.bootstrap, topic, uid)
    sink = KafkaSink(
        kafka.bootstrap, topic, uid=uid, key="key", wal=str(tmp_path / "wal"), shards=2
    )
    faults = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    coord = Coordinator([sink], log=str(tmp_path / "log"), app_id=APP, faults=faults)
    coord.run_epoch(0, memory_precommit(_batches(range(0, 100), None)), app_id=APP)
    with pytest.raises(InjectedFault):  # epoch 1 decided, not committed
        coord.run_epoch(1, memory_precommit(_batches(range(100, 200), 150)), app_id=APP)
    coord.close()

    # The operator lowers the topic's limit between the decision and the commit.
    _set_topic_config(kafka.bootstrap, topic, "max.message.bytes", "20000")
    done = _txsink("recover", "--log", str(tmp_path / "log"), "--pipeline", pipeline)
    assert done.returncode == 1, done.stdout + done.stderr
    err = " ".join(done.stderr.split())
    assert "epoch 1 is BLOCKED" in err, err
    assert "max.message.bytes" in err and "kafka-configs" in err and f"--entity-name {topic}" in err
    assert "key b'k150'" in err, err
    assert "recovery retries" not in err

    status = _txsink("status", "--log", str(tmp_path / "log"), "--json")
    assert status.returncode == 0, status.stderr
    epochs = {e["epoch"]: e for e in json.loads(status.stdout)["epochs"]}
    assert epochs[1]["status"] == "blocked"
    assert epochs[1]["blocked"]["sink_uid"] == uid
    assert "max.message.bytes" in epochs[1]["blocked"]["fix"]
    table = _txsink("status", "--log", str(tmp_path / "log"))
    assert "BLOCKED since" in table.stdout, table.stdout

    # Fixed: recover commits the epoch, exactly once, nothing left open.
    _set_topic_config(kafka.bootstrap, topic, "max.message.bytes", "1048588")
    done = _txsink("recover", "--log", str(tmp_path / "log"), "--pipeline", pipeline)
    assert done.returncode == 0, done.stdout + done.stderr
    assert open_log(tmp_path / "log").state(1).status == "committed"
    assert count_ids(range(200), _ids(kafka.bootstrap, topic)).ok
    assert open_transactions(kafka.bootstrap, topic) == 0
    assert not os.listdir(tmp_path / "wal") or all(
        not files for _, _, files in os.walk(tmp_path / "wal")
    )
