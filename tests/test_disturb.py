"""The chaos toolkit's disturbances (:mod:`txsink.testing.disturb`): drawn reproducibly,
a poison written into the input and healed in place (Spark's file source must read the
same file as the same epoch), and the judgement of a poisoned run."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from txsink.runner import RunReport
from txsink.testing.disturb import Disturbed, Poison, SecondDriver, draw, heal_input, poison_input
from txsink.testing.inputs import make_input


def _draw(seed: int, two: float, poison: float, limits: dict[str, int]) -> object:
    return draw(seed, 3, two_drivers=two, poison=poison, poison_limits=limits, rows_per_epoch=200)


def test_draw_is_reproducible_and_off_by_default() -> None:
    limits = {"kafka": 65536}
    assert _draw(5, 0.0, 0.0, limits) is None
    drawn = [_draw(s, 0.3, 0.3, limits) for s in range(200)]
    assert drawn == [_draw(s, 0.3, 0.3, limits) for s in range(200)]
    seconds = [d for d in drawn if isinstance(d, SecondDriver)]
    poisons = [d for d in drawn if isinstance(d, Poison)]
    assert 30 < len(seconds) < 90 and 30 < len(poisons) < 90
    assert all(0 <= d.after_epoch < 2 for d in seconds)  # the first has an epoch left to run
    assert all(p.size == 2 * 65536 and p.connector == "kafka" and 0 <= p.row < 200 for p in poisons)
    # No connector to poison: no poison plan.
    assert not any(isinstance(_draw(s, 0.0, 1.0, {}), Poison) for s in range(50))


def test_poison_and_heal_keep_the_file_and_its_epoch(tmp_path: Path) -> None:
    make_input(tmp_path, 30, 3)
    files = sorted(tmp_path.iterdir(), key=lambda p: p.stat().st_mtime)
    before = [(p.name, p.stat().st_mtime) for p in files]
    original = pq.read_table(files[1]).to_pylist()
    poison = Poison(epoch=1, row=4, size=1000, connector="kafka")

    poison_input(tmp_path, poison)
    rows = pq.read_table(files[1]).to_pylist()
    assert len(rows[4]["payload"]) == 1000 and rows[4]["id"] == original[4]["id"]
    others = [r for i, r in enumerate(rows) if i != 4]
    assert others == [r for i, r in enumerate(original) if i != 4]
    assert [(p.name, p.stat().st_mtime) for p in files] == before

    heal_input(tmp_path, poison)
    assert pq.read_table(files[1]).to_pylist() == original
    assert [(p.name, p.stat().st_mtime) for p in files] == before


def _judged(tmp_path: Path, failure: str | None, runs: int) -> Disturbed:
    make_input(tmp_path, 30, 3)
    watch = Disturbed(
        Poison(epoch=2, row=0, size=100, connector="kafka"),
        command=[],
        env={},
        input_dir=tmp_path,
        timeout=10,
        say=lambda _line: None,
    )
    watch.start()
    if failure is not None:
        watch.on_line(f"txsink: query failed: {failure}", set())
        watch.on_restart()
    watch.stop()
    watch.judge(RunReport(runs=runs, finished=True))
    return watch


def test_a_poison_refused_before_the_decision_passes(tmp_path: Path) -> None:
    ok = _judged(tmp_path, "[sink_uid=kafka] epoch 2 aborted, nothing of it is visible: ...", 2)
    assert ok.violations == [] and "epoch 2 aborted" in ok.notes[0]


def test_a_poison_refused_after_the_decision_or_taken_is_a_violation(tmp_path: Path) -> None:
    late = _judged(tmp_path / "a", "CommitError: commit of epoch 2 failed: message too large", 2)
    assert late.violations and "not refused before the decision" in late.violations[0]
    taken = _judged(tmp_path / "b", None, 1)
    assert taken.violations and "never refused" in taken.violations[0]
