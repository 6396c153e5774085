"""The history checker (:mod:`txsink.testing.history`) and its place in the observer.

Histories here are written by hand: each kind of violation once, found with its evidence,
and the histories the guarantee allows (an epoch growing partition by partition, a view
that cannot be read for a while) found clean. The real targets' histories are checked in
the chaos suite (``integration/test_cross_system.py``) and in every soak plan.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from txsink.testing.history import HistoryChecker
from txsink.testing.observer import Observer, Snapshot, by_epoch

EPOCHS = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
EPOCH_OF = {i: e for e, ids in EPOCHS.items() for i in ids}
EXPECTED = {e: len(ids) for e, ids in EPOCHS.items()}


def _check(samples: Sequence[Sequence[int]], **logs: Mapping[int, Sequence[int]]) -> list[str]:
    checker = HistoryChecker(EPOCH_OF, EXPECTED)
    for n, ids in enumerate(samples):
        snap = by_epoch(ids, EPOCH_OF, logs=logs.get(f"s{n}"))
        checker.observe(
            "t",
            float(n),
            rows=snap.rows,
            ids=snap.ids,
            duplicates=snap.duplicate_ids,
            logs=snap.logs,
        )
    return [f"{v.kind}|{v.evidence}|{v.count}" for v in checker.violations()]


def test_an_allowed_history_is_clean() -> None:
    # Epoch 0 becomes visible in two steps (two transactions), then epoch 1; a sample
    # repeats (nothing new): all allowed.
    assert _check([[], [0, 1], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7]]) == []


def test_each_violation_is_found_with_its_evidence() -> None:
    found = _check([[0, 1], [0], [0, 1, 1, 9], [0, 1, 2, 3]])
    assert found == [
        "duplicate|id 1 (epoch 0) visible twice at sample 3|1",
        "vanished|id 1 (epoch 0) visible at sample 1 (+0.00s), gone at sample 2 (+1.00s), "
        "back at sample 3|1",
        "unexpected|id 9 is in no epoch of the input|1",
    ]
    aborted = _check([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3]])
    assert aborted == [
        "aborted read|id 4 (epoch 1) visible from sample 1 (+0.00s) to 1, gone from sample 2 "
        "(+1.00s) to the end|2"
    ]


def test_overfull_epochs_and_log_order() -> None:
    checker = HistoryChecker(EPOCH_OF, EXPECTED)
    checker.observe("s3", 0.0, rows={0: 5})
    checker.observe("kafka", 0.0, rows={}, logs={0: (0, 4, 1), 1: (2, 3)})
    checker.observe("kafka", 1.0, rows={}, logs={0: (0, 4, 1, 5), 1: (2, 3, 6)})
    kinds = [(v.target, v.kind, v.evidence) for v in checker.violations()]
    assert kinds == [
        (
            "kafka",
            "order",
            "partition 0: record 2 (id 1) is of epoch 0, after record 1 of epoch 1",
        ),
        ("s3", "overfull", "epoch 0 showed 5 of its 4 rows"),
    ]


class Script:
    """A view that replays a scripted list of visible ids, one entry per sample."""

    counts_rows = True

    def __init__(self, name: str, script: list[list[int]], *, guaranteed: bool = True) -> None:
        self.name = name
        self.guaranteed = guaranteed
        self.script = script
        self.n = 0

    def sample(self, epoch_of: Mapping[int, int]) -> Snapshot:
        ids = self.script[min(self.n, len(self.script) - 1)]
        self.n += 1
        if ids == [-1]:
            raise ConnectionError("the server is down")
        return by_epoch(ids, epoch_of)

    def close(self) -> None:
        pass


def _observe(*views: Script) -> list[str]:
    observer = Observer(list(views), EPOCHS, interval=0.005).start()
    while any(v.n < len(v.script) for v in views):
        time.sleep(0.01)
    return list(observer.stop(settle=0.0).violations)


def test_the_observer_reports_the_history_of_guaranteed_views_only() -> None:
    full = list(range(8))
    # A reader saw rows of epoch 1 that were then gone for good, and a server that could
    # not be read for a while (samples that fail are no observation).
    bad = _observe(Script("pg", [[0, 1, 2, 3, 4], [-1], [0, 1, 2, 3], full]))
    assert any(v.startswith("history: pg: vanished: id 4 (epoch 1)") for v in bad), bad
    # The same history in a boundary view (read_uncommitted) is no violation.
    ok = _observe(
        Script("pg", [[0, 1, 2, 3], [-1], full]),
        Script("uncommitted", [[0, 1, 2, 3, 4], [0, 1, 2, 3], full], guaranteed=False),
    )
    assert ok == [], ok
