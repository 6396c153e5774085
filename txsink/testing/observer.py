"""Watch several targets while a pipeline runs: is every epoch all-or-nothing across them?

The cross-system guarantee of one :class:`~txsink.Coordinator` with several sinks is that
an epoch's outcome is the same in every target (committed everywhere or nowhere) and that
an epoch one target shows is eventually shown by all of them, without intervention. The
verifiers (:mod:`txsink.testing.verifiers`) read each target once, after the run; an
:class:`Observer` samples every target *during* the run (one background thread per target,
every ``interval`` seconds, reading only) and records, per target, when each epoch first
became visible and when it became complete::

    from txsink.connectors.kafka.testing import KafkaTarget
    from txsink.connectors.postgres.testing import PostgresTarget
    from txsink.testing.observer import Observer, input_epochs

    epochs = input_epochs(workdir / "input")             # epoch -> its ids (file i = epoch i)
    observer = Observer(
        [KafkaTarget(bootstrap, topic), PostgresTarget(dsn, "s.events")],
        epochs,
    )
    with observer:                                        # start(); stop() on exit
        run_the_pipeline()
    report = observer.report()
    print(report.table())
    report.assert_ok()

What a target shows is what a reader that honours the guarantee sees: Kafka with
``isolation.level=read_committed``, committed Postgres rows, S3 epochs through their
manifests. *Boundary* views (``guaranteed=False``: an S3 listing that ignores the manifests,
a Kafka ``read_uncommitted`` consumer) are sampled the same way and reported next to them,
but they are outside the guarantee: they count towards no violation and no skew.

Violations (:attr:`ObserverReport.violations`):

- an epoch some guaranteed target showed that another guaranteed target never showed
  completely by the end (the all-or-nothing property), or that is incomplete anywhere;
- an epoch of the input missing from a target at the end;
- rows taken back (a later sample shows fewer rows of an epoch than an earlier one);
- duplicates (an id seen twice) and ids that are not in the input.

An epoch that is *partly* visible for a moment is not a violation: sinks commit their
transactions one after another (Postgres one prepared transaction per Spark partition,
Kafka one transaction per shard), so a reader can see part of an epoch during the commit
step, or until a restart's recovery finishes a commit a crash interrupted. The report
gives that window per target (:attr:`EpochVisibility.partial_seconds`).

Skew (:attr:`EpochVisibility.skew`): the time from the first guaranteed target showing an
epoch to the last one showing it. Times come from this machine's clock, so the resolution
is the sampling interval plus one read of the target.

The targets of each connector are in its testing module, and its adapter lists them
(:meth:`~txsink.testing.adapter.ConnectorTesting.observer_targets`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, runtime_checkable

from txsink.testing.history import HistoryChecker
from txsink.testing.inputs import input_epochs
from txsink.testing.visibility import EpochVisibility, ObserverReport

__all__ = [
    "EpochVisibility",
    "Observer",
    "ObserverReport",
    "Snapshot",
    "Target",
    "by_epoch",
    "input_epochs",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """What one read of a target shows.

    ``rows``: epoch -> how many distinct ids of that epoch are visible (for a view that
    cannot count rows, e.g. an S3 listing, the number of objects). ``duplicates``: ids seen
    more than once; ``unexpected``: ids that belong to no epoch of the input.
    """

    rows: Mapping[int, int]
    duplicates: int = 0
    unexpected: int = 0
    #: The distinct ids visible (``None``: the view counts without ids), for the history
    #: checker (:mod:`txsink.testing.history`); ``duplicate_ids``: those visible twice.
    ids: frozenset[int] | None = None
    duplicate_ids: tuple[int, ...] = ()
    #: A log view's partitions: partition -> every id read from it so far, in log order.
    logs: Mapping[int, tuple[int, ...]] | None = None


@runtime_checkable
class Target(Protocol):
    """One target as a reader sees it. ``sample`` runs in the observer's thread for it."""

    name: str
    #: False for a view outside the guarantee (reported, never a violation).
    guaranteed: bool
    #: False when ``Snapshot.rows`` counts something else than rows (objects, say).
    counts_rows: bool

    def sample(self, epoch_of: Mapping[int, int]) -> Snapshot:
        """Read the target now; ``epoch_of`` maps every input id to its epoch."""
        ...

    def close(self) -> None:
        """Release connections; called once, from the target's thread."""
        ...


def by_epoch(
    ids: Iterable[int],
    epoch_of: Mapping[int, int],
    *,
    logs: Mapping[int, Sequence[int]] | None = None,
) -> Snapshot:
    """A snapshot from the ids a reader sees: distinct ids per epoch, duplicates, strays
    (``logs``: a log view's ids per partition in log order, see :class:`Snapshot`)."""
    counts = Counter(ids)
    rows: Counter[int] = Counter()
    unexpected = 0
    for id_ in counts:
        epoch = epoch_of.get(id_)
        if epoch is None:
            unexpected += 1
        else:
            rows[epoch] += 1
    twice = tuple(sorted(i for i, n in counts.items() if n > 1))
    return Snapshot(
        dict(rows),
        sum(n - 1 for n in counts.values() if n > 1),
        unexpected,
        ids=frozenset(counts),
        duplicate_ids=twice,
        logs=None if logs is None else {p: tuple(v) for p, v in logs.items()},
    )


@dataclass
class _Track:
    """Per target: what it showed, and when (the observer's thread for it writes this)."""

    first_seen: dict[int, float] = field(default_factory=dict)
    complete_at: dict[int, float] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    max_rows: dict[int, int] = field(default_factory=dict)
    regressions: list[str] = field(default_factory=list)
    duplicates: int = 0
    unexpected: int = 0
    samples: int = 0
    errors: int = 0
    last_error: str = ""


class Observer:
    """Samples every target in the background and judges all-or-nothing visibility.

    Args:
        targets: the views to sample (one thread each).
        expected: epoch -> the ids of that epoch in the input (see :func:`input_epochs`).
        interval: seconds between two samples of one target (plus the read itself).
    """

    def __init__(
        self,
        targets: Sequence[Target],
        expected: Mapping[int, Sequence[int]],
        *,
        interval: float = 0.05,
    ) -> None:
        names = [t.name for t in targets]
        if len(set(names)) != len(names):
            raise ValueError(f"Observer: target names must be unique, got {names}")
        if not any(t.guaranteed for t in targets):
            raise ValueError("Observer: at least one target must be a guaranteed view")
        self.targets = tuple(targets)
        self.expected = {int(e): len(set(ids)) for e, ids in expected.items()}
        self.epoch_of = {int(i): int(e) for e, ids in expected.items() for i in ids}
        self.interval = interval
        self._tracks = {t.name: _Track() for t in targets}
        self.history = HistoryChecker(self.epoch_of, self.expected)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Observer:
        if self._threads:
            raise RuntimeError("Observer.start() called twice")
        for target in self.targets:
            thread = threading.Thread(
                target=self._loop,
                args=(target,),
                name=f"txsink-observer-{target.name}",
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()
        return self

    def stop(self, *, settle: float = 10.0) -> ObserverReport:
        """Sample until every target is complete or has not changed for a while (at most
        ``settle`` seconds: reads lag behind commits a little), stop, and report."""
        deadline = time.monotonic() + settle
        stable_since = time.monotonic()
        last: dict[str, dict[int, int]] = {}
        while time.monotonic() < deadline and self._threads:
            with self._lock:
                now = {n: dict(t.last) for n, t in self._tracks.items()}
            if self._all_complete(now):
                break
            if now != last:
                last, stable_since = now, time.monotonic()
            elif time.monotonic() - stable_since > max(2.0, 20 * self.interval):
                break
            time.sleep(self.interval)
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        return self.report()

    def __enter__(self) -> Observer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._stop.is_set():
            self.stop(settle=0.0 if exc is not None else 10.0)

    # -- sampling -----------------------------------------------------------------------

    def _all_complete(self, now: Mapping[str, Mapping[int, int]]) -> bool:
        return all(
            now[t.name].get(e, 0) >= n
            for t in self.targets
            if t.guaranteed
            for e, n in self.expected.items()
        )

    def _loop(self, target: Target) -> None:
        track = self._tracks[target.name]
        try:
            while True:
                stopping = self._stop.is_set()
                try:
                    snap = target.sample(self.epoch_of)
                except Exception as err:
                    with self._lock:
                        track.errors += 1
                        track.last_error = f"{type(err).__name__}: {err}"[:300]
                else:
                    self._record(target, track, snap, time.time())
                if stopping:
                    return  # one last sample after stop() was asked for
                self._stop.wait(self.interval)
        finally:
            with contextlib.suppress(Exception):
                target.close()

    def _record(self, target: Target, track: _Track, snap: Snapshot, at: float) -> None:
        with self._lock:
            if target.guaranteed:
                self.history.observe(
                    target.name,
                    at,
                    rows=snap.rows,
                    ids=snap.ids,
                    duplicates=snap.duplicate_ids,
                    logs=snap.logs,
                )
            track.samples += 1
            track.duplicates = max(track.duplicates, snap.duplicates)
            track.unexpected = max(track.unexpected, snap.unexpected)
            for epoch, rows in snap.rows.items():
                if rows <= 0:
                    continue
                track.first_seen.setdefault(epoch, at)
                full = self.expected.get(epoch)
                if (not target.counts_rows or (full is not None and rows >= full)) and (
                    epoch not in track.complete_at
                ):
                    track.complete_at[epoch] = at
                if rows > track.max_rows.get(epoch, 0):
                    track.max_rows[epoch] = rows
            for epoch, before in track.last.items():
                now = snap.rows.get(epoch, 0)
                if now < before and target.guaranteed:
                    track.regressions.append(
                        f"{target.name}: epoch {epoch} went from {before} to {now} visible rows"
                    )
            track.last = dict(snap.rows)

    # -- judging ------------------------------------------------------------------------

    def report(self) -> ObserverReport:
        with self._lock:
            tracks = {n: _Track(**vars(t)) for n, t in self._tracks.items()}
        guaranteed = tuple(t.name for t in self.targets if t.guaranteed)
        by_name = {t.name: t for t in self.targets}
        shown = sorted({e for t in tracks.values() for e in t.first_seen} | set(self.expected))
        epochs = {
            e: EpochVisibility(
                epoch=e,
                expected_rows=self.expected.get(e, 0),
                first_seen={n: t.first_seen[e] for n, t in tracks.items() if e in t.first_seen},
                complete_at={n: t.complete_at[e] for n, t in tracks.items() if e in t.complete_at},
                final_rows={n: t.last.get(e, 0) for n, t in tracks.items()},
                guaranteed=guaranteed,
            )
            for e in shown
        }
        violations: list[str] = []
        with self._lock:
            history = tuple(self.history.violations())
        violations.extend(f"history: {v}" for v in history)
        for name in guaranteed:
            track = tracks[name]
            if track.samples == 0:
                violations.append(f"{name}: never read ({track.last_error or 'no sample'})")
            violations.extend(track.regressions[:5])
            judged = {v.kind for v in history if v.target == name}
            if track.duplicates and "duplicate" not in judged:
                violations.append(f"{name}: {track.duplicates} duplicate id(s)")
            if track.unexpected and "unexpected" not in judged:
                violations.append(f"{name}: {track.unexpected} id(s) not in the input")
        for e, vis in epochs.items():
            showing = sorted(n for n in guaranteed if n in vis.first_seen)
            if e not in self.expected:
                violations.append(f"epoch {e}: shown by {showing} but not in the input")
                continue
            full = self.expected[e]
            short = [
                f"{n} ({vis.final_rows.get(n, 0)}/{full})"
                for n in guaranteed
                if by_name[n].counts_rows and vis.final_rows.get(n, 0) != full
            ]
            if not short:
                continue
            if showing:
                violations.append(
                    f"epoch {e}: shown by {showing} but not complete at the end in {short}"
                )
            else:
                violations.append(f"epoch {e}: missing at the end in {short}")
        return ObserverReport(
            targets=tuple(t.name for t in self.targets),
            guaranteed=guaranteed,
            epochs=epochs,
            violations=tuple(violations),
            samples={n: t.samples for n, t in tracks.items()},
            sample_errors={n: t.errors for n, t in tracks.items()},
            interval=self.interval,
            history=history,
        )
