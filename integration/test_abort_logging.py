"""Every abort is told once, by the core, the same way for every connector: one INFO line
``recovery: aborted <txn>: <why>`` of the coordinator's logger per transaction, and no
line of the connector's own about it. Against each registered connector's real target.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from conftest import services_for, variant_params
from txsink import Coordinator
from txsink.testing import contract
from txsink.testing.adapter import adapter


@pytest.mark.parametrize(("connector", "variant"), variant_params())
def test_each_abort_is_one_line_of_the_core(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    connector: str,
    variant: str,
) -> None:
    env: dict[str, str] = {}
    for service in services_for(request, [connector]).values():
        env.update(service.env())
    found = adapter(connector)
    run = contract.ContractRun(found, tmp_path, env=env, options=found.variants[variant])
    try:
        spec, sink = run.target()
        if sink.commits_from_data:
            pytest.skip("this variant prepares nothing in the target: there is nothing to abort")
        # A run that crashed before its decision left these prepared.
        handles = run.prepare(sink, 0, contract.PARTS)
        coordinator = Coordinator(sink, log=str(tmp_path / "txlog"), app_id=run.app_id)
        coordinator.log.bind_app(run.app_id)
        caplog.set_level(logging.DEBUG, logger="txsink")  # the core's and connectors' records
        coordinator.recover()
        for name in (str(h.txn) for h in handles):
            told = [
                r for r in caplog.records if r.name.startswith("txsink") and name in r.getMessage()
            ]
            assert len(told) == 1, [(r.name, r.getMessage()) for r in told]
            assert told[0].name == "txsink.coordinator" and told[0].levelno == logging.INFO
            assert told[0].getMessage() == (
                f"[uid={sink.uid} epoch=0] recovery: aborted {name}: epoch 0 round 0 is undecided"
            )
        assert run.seen(spec, [])[1] == 0, "the aborted transactions linger"
    finally:
        run.drop()
