"""A 10 s Postgres outage during an epoch's pre-commit is ridden out in the same query run
(issue 34 point 7, ``Coordinator(outage_s=)``, :mod:`txsink.protocol.rounds`).

One coordinator writes Postgres and Kafka (direct mode: the single pass; WAL mode: the
two-phase path). The sinks reach Postgres through a proxy
(:class:`~txsink.testing.netproxy.NetProxy`), which is cut (connections reset, new ones
refused) when a task of epoch 1 has written its rows and not yet prepared, and healed 10 s
later; no server is stopped. The epoch's failed rounds are voided and run again after
pauses until one is decided: the query needs one run, no restart. Read back with each
connector's verifier (psycopg; a read_committed consumer): every id once, nothing
prepared or open.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.streaming import prepare_input, run_until_done
from txsink import Coordinator
from txsink.testing.hooks import PointHooks
from txsink.testing.targets import new_targets
from txsink.testing.verifiers import verify

ROWS, FILES, OUTAGE_S = 600, 3, 10.0
#: The coordinator's WARNING for a round that failed and runs again (txsink.protocol.rounds).
RETRIED = "failed before its decision"


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.kafka
@pytest.mark.parametrize("mode", ["direct", "wal"])
def test_a_postgres_outage_during_precommit_is_ridden_out_without_a_restart(
    spark: Any,
    postgres: Any,
    kafka: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    mode: str,
) -> None:
    env = {**postgres.env(), **kafka.env()}
    pg, kf = new_targets(
        ["postgres", "kafka"], tmp_path, tag=f"outage-{mode}", env=env,
        options={"kafka": {"mode": mode}},
    )  # fmt: skip
    proxy, address = postgres.with_proxy()
    pg = pg.through(**postgres.env(address))
    prepare_input(tmp_path, ROWS, FILES)
    hooks = PointHooks(tmp_path / "hooks")
    timers: list[threading.Timer] = []

    def cut() -> None:
        proxy.cut()
        timer = threading.Timer(OUTAGE_S, proxy.heal)
        timer.start()
        timers.append(timer)

    hooks.at("before_precommit", cut, epoch=1, partition=1)
    caplog.set_level(logging.WARNING, logger="txsink")
    log = str(tmp_path / "txlog")

    def make() -> Coordinator:
        sinks = [pg.sink(), kf.sink()]
        return Coordinator(sinks, log=log, faults=hooks.plan(), outage_s=4 * OUTAGE_S)

    try:
        with hooks:
            restarts, errors = run_until_done(spark, tmp_path, make, max_runs=1)
    finally:
        for timer in timers:
            timer.cancel()
        proxy.heal()
    assert hooks.fired, "the outage was never injected"
    assert not hooks.errors, hooks.errors
    assert restarts == 0 and errors == []
    retried = [r.getMessage() for r in caplog.records if RETRIED in r.getMessage()]
    assert retried, "no round was run again: the outage did not hit the epoch"
    assert all("epoch=1]" in line for line in retried), retried
    assert proxy.stats.accepted > 0, "the Postgres sink did not go through the proxy"
    for target in (pg, kf):
        verdict = verify(target.verifier(range(ROWS), log=log))
        assert verdict.ok, verdict
