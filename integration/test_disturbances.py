"""Two production failures that are not crashes, through the chaos toolkit
(:mod:`txsink.testing.disturb`), against the real servers:

- a second live driver of a running query is refused before it touches anything, and
  the first finishes in the run it is in;
- a record a target refuses (a Kafka record over its topic's ``max.message.bytes``)
  aborts its epoch before the decision, in every target; once the input is fixed the
  query resumes and every target holds every row once.

Each target is read back by its own verifier (not txsink's code) and watched by the
cross-system observer during the run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from txsink.testing import run_chaos
from txsink.testing.disturb import Poison, SecondDriver
from txsink.testing.inputs import input_epochs, make_input
from txsink.testing.targets import RunTarget, child_env, new_targets

# Starts Spark drivers in child processes: the session builds the CDS archive first.
pytestmark = pytest.mark.spark

ROWS, FILES = 300, 3


def _run(
    tmp_path: Path,
    connectors: Sequence[str],
    disturbance: SecondDriver | Poison,
    options: dict[str, dict[str, Any]] | None = None,
) -> tuple[Any, list[RunTarget]]:
    make_input(tmp_path / "input", ROWS, FILES)
    made = new_targets(list(connectors), tmp_path, tag="disturb", options=options)
    log = str(tmp_path / "txlog")
    report = run_chaos(
        "txsink.testing.pipelines:run_stream",
        "",
        workdir=tmp_path,
        sinks_verifiers={t.connector: t.verifier(range(ROWS), log=log) for t in made},
        args={"workdir": str(tmp_path), "sinks": [t.spec for t in made], "log": log},
        env=child_env(made),
        max_runs=4,
        observe=[view for t in made for view in t.observer_targets()],
        expected_epochs=input_epochs(tmp_path / "input"),
        disturbance=disturbance,
    )
    return report, made


@pytest.fixture
def dropped() -> Iterator[list[RunTarget]]:
    made: list[RunTarget] = []
    yield made
    for target in made:
        target.adapter.drop_target(target.spec, target.env)


@pytest.mark.spark
@pytest.mark.chaos
@pytest.mark.postgres
def test_a_second_driver_is_refused_and_the_first_is_undisturbed(
    tmp_path: Path, postgres: Any, dropped: list[RunTarget]
) -> None:
    report, made = _run(tmp_path, ("files", "postgres"), SecondDriver(after_epoch=0))
    dropped += made
    assert report.ok, report.table()
    assert report.runs == 1, report.table()
    # The second driver really ran, and was refused (not merely idle after the first).
    assert any("second driver: exit code" in n for n in report.disturbance_notes), report.table()
    assert all(v.lingering == 0 for v in report.verdicts.values()), report.table()


@pytest.mark.spark
@pytest.mark.chaos
@pytest.mark.kafka
@pytest.mark.postgres
def test_a_poison_record_is_refused_before_the_decision_then_resumes(
    tmp_path: Path, kafka: Any, postgres: Any, dropped: list[RunTarget]
) -> None:
    from txsink.connectors.kafka.testing import KafkaTesting

    assert KafkaTesting.poison is not None
    options, limit = KafkaTesting.poison
    poison = Poison(epoch=1, row=7, size=2 * limit, connector="kafka")
    report, made = _run(
        tmp_path, ("files", "postgres", "kafka"), poison, options={"kafka": dict(options)}
    )
    dropped += made
    assert report.ok, report.table()
    # Refused once (the epoch aborted everywhere), fixed, then resumed: two runs.
    assert report.runs == 2, report.table()
    refusal = report.disturbance_notes[0]
    assert "epoch 1 aborted" in refusal and "kafka" in refusal, refusal
    assert all(v.lingering == 0 for v in report.verdicts.values()), report.table()
