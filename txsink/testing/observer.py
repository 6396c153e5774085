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
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from txsink.testing.inputs import input_epochs

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


def by_epoch(ids: Iterable[int], epoch_of: Mapping[int, int]) -> Snapshot:
    """A snapshot from the ids a reader sees: distinct ids per epoch, duplicates, strays."""
    counts = Counter(ids)
    rows: Counter[int] = Counter()
    unexpected = 0
    for id_ in counts:
        epoch = epoch_of.get(id_)
        if epoch is None:
            unexpected += 1
        else:
            rows[epoch] += 1
    return Snapshot(dict(rows), sum(n - 1 for n in counts.values() if n > 1), unexpected)


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


@dataclass(frozen=True)
class EpochVisibility:
    """One epoch: when each target first showed it, when it was complete there, and the end."""

    epoch: int
    expected_rows: int
    first_seen: Mapping[str, float]
    complete_at: Mapping[str, float]
    final_rows: Mapping[str, int]
    guaranteed: tuple[str, ...]

    @property
    def skew(self) -> float | None:
        """Seconds from the first guaranteed target showing the epoch to the last one
        (None unless every guaranteed target showed it)."""
        times = [self.first_seen[t] for t in self.guaranteed if t in self.first_seen]
        if not times or len(times) != len(self.guaranteed):
            return None
        return max(times) - min(times)

    @property
    def complete_skew(self) -> float | None:
        """The same for the time each target showed the epoch *complete*."""
        times = [self.complete_at[t] for t in self.guaranteed if t in self.complete_at]
        if not times or len(times) != len(self.guaranteed):
            return None
        return max(times) - min(times)

    def partial_seconds(self, target: str) -> float | None:
        """How long ``target`` showed only part of the epoch (0.0 if never seen partial)."""
        if target not in self.first_seen or target not in self.complete_at:
            return None
        return self.complete_at[target] - self.first_seen[target]

    def lead(self, view: str) -> float | None:
        """How long before the first guaranteed target a boundary ``view`` showed the epoch."""
        times = [self.first_seen[t] for t in self.guaranteed if t in self.first_seen]
        if view not in self.first_seen or not times:
            return None
        return min(times) - self.first_seen[view]


def _stats(values: Sequence[float]) -> tuple[float | None, float | None]:
    return (statistics.median(values), max(values)) if values else (None, None)


@dataclass(frozen=True)
class ObserverReport:
    """What the observer saw: per epoch, per target, and the violations."""

    targets: tuple[str, ...]
    guaranteed: tuple[str, ...]
    epochs: Mapping[int, EpochVisibility]
    violations: tuple[str, ...]
    samples: Mapping[str, int]
    sample_errors: Mapping[str, int]
    interval: float

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def skews(self) -> list[float]:
        """The skew of every epoch all guaranteed targets showed."""
        return [s for e in self.epochs.values() if (s := e.skew) is not None]

    @property
    def complete_skews(self) -> list[float]:
        return [s for e in self.epochs.values() if (s := e.complete_skew) is not None]

    @property
    def skew_median(self) -> float | None:
        return _stats(self.skews)[0]

    @property
    def skew_max(self) -> float | None:
        return _stats(self.skews)[1]

    def partial_max(self, target: str) -> float | None:
        """The longest time ``target`` showed an epoch only partly."""
        values = [p for e in self.epochs.values() if (p := e.partial_seconds(target)) is not None]
        return max(values) if values else None

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        return {
            "ok": self.ok,
            "targets": list(self.targets),
            "guaranteed": list(self.guaranteed),
            "violations": list(self.violations),
            "samples": dict(self.samples),
            "sample_errors": dict(self.sample_errors),
            "interval": self.interval,
            "skew_median": r(self.skew_median),
            "skew_max": r(self.skew_max),
            "complete_skew_median": r(_stats(self.complete_skews)[0]),
            "complete_skew_max": r(_stats(self.complete_skews)[1]),
            "partial_max": {t: r(self.partial_max(t)) for t in self.targets},
        }

    def table(self) -> str:
        """One row per epoch: first visibility per target (seconds after the earliest), skew."""
        from txsink.testing.chaos import format_table

        starts = [t for e in self.epochs.values() for t in e.first_seen.values()]
        t0 = min(starts) if starts else 0.0

        def cell(e: EpochVisibility, target: str) -> str:
            if target not in e.first_seen:
                return "-"
            text = f"{e.first_seen[target] - t0:.2f}"
            part = e.partial_seconds(target)
            if part:
                text += f" (+{part:.2f} partial)"
            return text + f" [{e.final_rows.get(target, 0)}]"

        rows = [
            (
                e.epoch,
                e.expected_rows,
                *(cell(e, t) for t in self.targets),
                "-" if e.skew is None else f"{e.skew:.3f}",
            )
            for e in sorted(self.epochs.values(), key=lambda v: v.epoch)
        ]
        med, top = self.skew_median, self.skew_max
        head = (
            f"observer: {'ok' if self.ok else f'{len(self.violations)} VIOLATION(S)'}; skew "
            f"median {'-' if med is None else f'{med:.3f}s'}, max "
            f"{'-' if top is None else f'{top:.3f}s'} over {len(self.skews)} epoch(s); samples "
            f"{dict(self.samples)}, errors {dict(self.sample_errors)}"
        )
        cols = ("epoch", "rows", *self.targets, "skew s")
        body = format_table(cols, rows)
        return "\n".join([head, body, *(f"  violation: {v}" for v in self.violations)])

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError("the cross-system observer saw violations\n" + self.table())


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
        for name in guaranteed:
            track = tracks[name]
            if track.samples == 0:
                violations.append(f"{name}: never read ({track.last_error or 'no sample'})")
            violations.extend(track.regressions[:5])
            if track.duplicates:
                violations.append(f"{name}: {track.duplicates} duplicate id(s)")
            if track.unexpected:
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
        )
