"""Chaos plans: a reproducible list of faults, declared or drawn from a seeded generator.

A plan is decided completely when it is created: a probability or a random schedule is
rolled once, with the plan's seed, never at run time. The same seed therefore gives the
same :attr:`ChaosPlan.spec` on every machine and after every restart, and the spec is
all a child process needs (``TXSINK_FAULT``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from txsink.protocol.faults import TASK_POINTS, CrashPoint, Fault, FaultMode, FaultPlan

__all__ = ["DEFAULT_MODES", "DEFAULT_POINTS", "ChaosPlan"]

#: Every crash point; ``during_recovery`` is always preceded by a fault that gives
#: recovery something to do.
DEFAULT_POINTS: tuple[CrashPoint, ...] = tuple(CrashPoint)
#: Task-only modes (``kill-worker``, ``kill-executor``) are drawn at task points only.
DEFAULT_MODES: tuple[FaultMode, ...] = (FaultMode.RAISE, FaultMode.KILL_DRIVER)


@dataclass(frozen=True)
class ChaosPlan:
    """Faults to inject into one run of a pipeline, in ``txsink.protocol.faults`` terms.

    Build one from faults (``ChaosPlan.of("after_decision:kill-driver@1", ...)``), from a
    spec (``ChaosPlan.parse(...)``) or at random (``ChaosPlan.random(seed, ...)``).
    ``seed`` is informational for declared plans and the generator's seed for random ones.
    """

    faults: tuple[Fault, ...]
    seed: int | None = None

    def __post_init__(self) -> None:
        for fault in self.faults:
            if not isinstance(fault, Fault):
                raise TypeError(f"ChaosPlan: expected txsink.protocol.faults.Fault, got {fault!r}")

    # -- constructors ----------------------------------------------------------------

    @classmethod
    def of(cls, *faults: Fault | str, seed: int | None = None) -> ChaosPlan:
        """A plan from :class:`~txsink.protocol.faults.Fault` objects and/or spec strings."""
        out: list[Fault] = []
        for f in faults:
            if isinstance(f, Fault):
                out.append(f)
            else:
                # The faults only: a FaultPlan would make a state folder that stays
                # until this process ends.
                out.extend(Fault.parse(s) for s in f.split(",") if s.strip())
        return cls(tuple(out), seed)

    @classmethod
    def parse(cls, spec: str) -> ChaosPlan:
        """A plan from a ``txsink.protocol.faults`` spec:
        ``POINT[:MODE][@EPOCH][#PARTITION][*TIMES]``, comma-separated."""
        if not spec.strip():
            return cls(())
        return cls.of(spec)

    @classmethod
    def none(cls) -> ChaosPlan:
        """No fault: a baseline run."""
        return cls(())

    @classmethod
    def random(
        cls,
        seed: int,
        epochs: int,
        partitions: int = 2,
        *,
        points: Iterable[CrashPoint | str] = DEFAULT_POINTS,
        modes: Iterable[FaultMode | str] = DEFAULT_MODES,
        n: int = 1,
        probability: float = 1.0,
        targets: Sequence[str] = (),
    ) -> ChaosPlan:
        """``n`` faults drawn with ``random.Random(seed)``, each at its own epoch.

        Args:
            seed: the generator's seed; the same arguments give the same plan.
            epochs: the epochs the input produces (``0..epochs-1``); ``n`` is capped at it.
            partitions: the Spark partitions of the query (task faults pick one).
            points, modes: what to draw from. Task-only modes (``kill-worker``,
                ``kill-executor``) are only drawn at task points; a driver point drawn
                with only those available falls back to ``raise``.
            n: how many faults to draw.
            probability: each drawn fault is kept with this probability, decided here
                with the same generator (so the plan stays reproducible).
            targets: the target servers a ``kill-target`` fault may name (one is drawn per
                fault); needed when ``modes`` has ``kill-target``.

        A ``during_recovery`` fault at epoch ``e`` comes with a ``during_commit`` fault at
        ``e`` first, so that recovery has a half-committed epoch to finish.
        """
        if epochs < 1:
            raise ValueError("ChaosPlan.random: epochs must be >= 1")
        if partitions < 1:
            raise ValueError("ChaosPlan.random: partitions must be >= 1")
        if not 0.0 <= probability <= 1.0:
            raise ValueError("ChaosPlan.random: probability must be in [0, 1]")
        point_list = sorted({CrashPoint(p) for p in points}, key=list(CrashPoint).index)
        mode_list = sorted({FaultMode(m) for m in modes}, key=list(FaultMode).index)
        if not point_list or not mode_list:
            raise ValueError("ChaosPlan.random: points and modes must not be empty")
        if FaultMode.KILL_TARGET in mode_list and not targets:
            raise ValueError(
                "ChaosPlan.random: kill-target needs the names of the target servers "
                "(targets=...; `txsink chaos soak --targets`)"
            )
        rng = random.Random(seed)  # noqa: S311 - a reproducible plan, not a secret
        chosen = sorted(rng.sample(range(epochs), min(n, epochs)))
        faults: list[Fault] = []
        for epoch in chosen:
            point = rng.choice(point_list)
            allowed = [m for m in mode_list if _fits(point, m)]
            mode = rng.choice(allowed) if allowed else FaultMode.RAISE
            partition = rng.randrange(partitions) if point in TASK_POINTS else None
            # Drawn only for kill-target: plans without it replay as they always did.
            target = rng.choice(list(targets)) if mode is FaultMode.KILL_TARGET else None
            keep = rng.random() < probability
            if not keep:
                continue
            if point is CrashPoint.DURING_RECOVERY:
                faults.append(Fault(CrashPoint.DURING_COMMIT, mode, epoch=epoch, target=target))
            faults.append(Fault(point, mode, epoch=epoch, partition=partition, target=target))
        return cls(tuple(faults), seed)

    # -- derived ---------------------------------------------------------------------

    def sample(self, probability: float, seed: int) -> ChaosPlan:
        """Keep each fault with ``probability``, decided now with ``random.Random(seed)``."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError("ChaosPlan.sample: probability must be in [0, 1]")
        rng = random.Random(seed)  # noqa: S311 - a reproducible plan, not a secret
        return ChaosPlan(tuple(f for f in self.faults if rng.random() < probability), seed)

    @property
    def spec(self) -> str:
        """The ``TXSINK_FAULT`` text for this plan (empty: no fault)."""
        return ",".join(str(f) for f in self.faults)

    @property
    def crashes_expected(self) -> int:
        """Fault firings the plan holds (an upper bound: a fault whose point is never
        reached, e.g. recovery with nothing to do, does not fire)."""
        return sum(f.times for f in self.faults)

    def fault_plan(self, state_dir: str) -> FaultPlan:
        """The :class:`~txsink.protocol.faults.FaultPlan` for an in-process ``Coordinator``."""
        return FaultPlan(self.faults, state_dir)

    def __str__(self) -> str:
        return self.spec or "(no faults)"

    def __len__(self) -> int:
        return len(self.faults)


def _fits(point: CrashPoint, mode: FaultMode) -> bool:
    """Whether ``txsink.protocol.faults`` accepts ``mode`` at ``point`` (task-only modes, e.g.)."""
    try:
        Fault(point, mode)
    except ValueError:
        return False
    return True
