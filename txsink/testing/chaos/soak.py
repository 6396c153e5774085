"""The soak: many random chaos plans, one after the other, across connectors.

Each plan gets a fresh folder, a deterministic input of ``epochs`` files, and one query
writing to every selected connector at once (one coordinator, so a plan also checks the
atomicity across sinks), run by :func:`~txsink.testing.chaos.run_chaos` under
``ChaosPlan.random(plan_seed, ...)``. The plan seeds come from ``random.Random(seed)``:
the same ``seed`` replays the same soak.

Connectors: every registered connector, through its testing adapter. One that needs
no server (files) is always available; the others when the environment names their
server (``TXSINK_PG_DSN``, ``TXSINK_KAFKA_BOOTSTRAP``, ``TXSINK_S3_ENDPOINT`` with
``TXSINK_S3_ACCESS_KEY``, ``TXSINK_S3_SECRET_KEY``, ``TXSINK_S3_REGION``: the
variables ``integration/services up`` writes to ``integration/.services.env``).

Target crashes: given ``targets`` (name -> :class:`~txsink.testing.chaos.targetcrash.TargetControl`)
and ``kill-target`` among ``modes``, plans draw faults that SIGKILL a target's server at a
crash point; ``timer_kills`` is the chance that a plan also kills a drawn server at a
random moment (1-20 s into its first run). Every server is up again before a restart.

Resumable: with ``results`` (a JSON-lines file), every finished plan is appended to it as
it ends, and a later call with the same file and settings runs the plans that are not in
it yet: the ones an interrupted run left out, then the next seeds of the same sequence.
:func:`txsink.testing.chaos.soaklog.summary` tallies the file across every run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txsink import registry
from txsink.protocol.faults import CrashPoint, FaultMode
from txsink.testing.adapter import adapter
from txsink.testing.chaos.plan import DEFAULT_MODES, DEFAULT_POINTS, ChaosPlan
from txsink.testing.chaos.run import ChaosReport, run_chaos
from txsink.testing.chaos.soaklog import done_indices, settings_line
from txsink.testing.chaos.targetcrash import TargetControl
from txsink.testing.disturb import Poison, draw
from txsink.testing.inputs import input_epochs, make_input
from txsink.testing.tables import format_table
from txsink.testing.targets import available_connectors, child_env, new_targets

__all__ = ["SoakResult", "available_connectors", "soak"]

PIPELINE = "txsink.testing.pipelines:run_stream"


@dataclass
class SoakResult:
    """Every plan's report, and the totals."""

    seed: int
    connectors: list[str]
    reports: list[ChaosReport] = field(default_factory=list)

    @property
    def restarts(self) -> int:
        return sum(r.restarts for r in self.reports)

    @property
    def violations(self) -> int:
        return sum(r.violations for r in self.reports)

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def recoveries(self) -> list[float]:
        return [s for r in self.reports for s in r.recovery_seconds if s is not None]

    def tally(self) -> str:
        """One line: plans so far, restarts, violations, recovery median/max."""
        rec = self.recoveries()
        med = f"{statistics.median(rec):.1f}s" if rec else "-"
        top = f"{max(rec):.1f}s" if rec else "-"
        return (
            f"{len(self.reports)} plan(s), {self.restarts} restart(s), "
            f"{self.violations} violation(s), recovery median {med} max {top}"
        )

    def table(self) -> str:
        """One row per plan, then the totals."""
        cols = ("#", "seed", "plan", "runs", "fired", "recovery max", "violations", "verdict")
        rows = [
            (
                i,
                r.seed,
                r.plan or r.disturbance or "(no faults)",
                r.runs,
                f"{len(r.faults_fired)}/{r.faults_planned}",
                "-" if r.recovery_max is None else f"{r.recovery_max:.1f}s",
                r.violations,
                "ok" if r.ok else "FAIL",
            )
            for i, r in enumerate(self.reports)
        ]
        body = format_table(cols, rows)
        return (
            f"{body}\nsoak seed {self.seed}, connectors {','.join(self.connectors)}: {self.tally()}"
        )


def _draw_variants(connectors: Sequence[str], seed: int) -> dict[str, dict[str, Any]]:
    """The options each connector runs a plan with: its default variant, or (one plan in
    two, drawn with the plan's seed) a variant whose sink commits in its tasks, so a soak
    exercises single-pass epochs too, next to every other sink."""
    rng = random.Random(seed ^ 0x5EED)  # noqa: S311 - a reproducible soak, not a secret
    drawn: dict[str, dict[str, Any]] = {}
    for name in connectors:
        found = adapter(name)
        single = sorted(found.single_pass_variants)
        if single and rng.random() < 0.5:
            drawn[name] = dict(found.variants[rng.choice(single)])
    return drawn


def soak(
    plans: int,
    seed: int,
    *,
    workdir: str | os.PathLike[str],
    connectors: Sequence[str] | None = None,
    epochs: int = 3,
    rows: int = 600,
    partitions: int = 2,
    faults_per_plan: int = 1,
    points: Iterable[CrashPoint | str] = DEFAULT_POINTS,
    modes: Iterable[FaultMode | str] = DEFAULT_MODES,
    probability: float = 1.0,
    max_runs: int = 10,
    jobs: int = 1,
    on_progress: Callable[[str], None] | None = None,
    on_plan: Callable[[int, ChaosReport, SoakResult], None] | None = None,
    env: Mapping[str, str] | None = None,
    targets: Mapping[str, TargetControl] | None = None,
    down_s: float = 2.0,
    timer_kills: float = 0.0,
    results: str | os.PathLike[str] | None = None,
    prune: bool = False,
    observe: bool = True,
    two_drivers: float = 0.0,
    poison: float = 0.0,
) -> SoakResult:
    """Run ``plans`` random chaos plans; ``on_plan(index, report, result_so_far)`` after each.

    ``connectors`` defaults to :func:`available_connectors`. Each plan's folder
    ``workdir/plan-<i>`` is kept (input, outputs, txsink log, checkpoint, fault markers).
    ``jobs`` plans run at once (each its own queries, tables, topics and buckets; they
    share the servers and Kafka's marker topic, as pipelines in production do). The plans
    and the final order of ``reports`` depend only on ``seed``, never on ``jobs``.

    ``env``: where the servers are (default ``os.environ``). ``targets``, ``down_s``,
    ``timer_kills``: target crashes (module doc). ``results``: the JSON-lines file that
    makes the soak resumable (module doc). ``prune``: delete the folder of a plan that
    passed (a long soak's disk), keep the failed ones. ``observe``: read every target
    concurrently during each plan and check the history those readers saw
    (:mod:`txsink.testing.history`); its violations count as the plan's.
    ``two_drivers``, ``poison``: the chance that a plan is, instead of its faults, a second
    live driver of the query or a poison record in its input (:mod:`txsink.testing.disturb`;
    poison only with a connector whose adapter declares one). At 0 (the default) the soak
    draws exactly the plans it drew before these existed.
    """
    if jobs < 1:
        raise ValueError(f"soak: jobs must be at least 1, not {jobs}")
    source = dict(os.environ if env is None else env)
    chosen = list(connectors) if connectors is not None else available_connectors(source)
    for name in set(chosen) & set(registry.unloadable()):
        raise registry.unloadable()[name].error()
    unknown = sorted(set(chosen) - set(registry.connectors()))
    if unknown:
        raise ValueError(
            f"soak: unknown connector(s) {unknown}; registered: {list(registry.connectors())}"
        )
    not_served = [c for c in chosen if not adapter(c).available(source)]
    if not_served:
        raise ValueError(
            "soak: no server for "
            + ", ".join(f"{c} (set {', '.join(adapter(c).env_vars)})" for c in not_served)
        )
    point_list = list(points)
    mode_list = [FaultMode(m) for m in modes]
    servers = dict(targets or {})
    if FaultMode.KILL_TARGET in mode_list and not servers:
        raise ValueError("soak: kill-target needs targets (name -> a control of its server)")
    settings = settings_line(
        seed=seed,
        connectors=chosen,
        epochs=epochs,
        rows=rows,
        partitions=partitions,
        faults_per_plan=faults_per_plan,
        points=[str(p) for p in point_list],
        modes=[str(m) for m in mode_list],
        probability=probability,
        targets=sorted(servers),
        timer_kills=timer_kills,
        # Only when drawn: the settings (and so the resumable results) of older soaks stay.
        **({"two_drivers": two_drivers} if two_drivers else {}),
        **({"poison": poison} if poison else {}),
    )
    poison_limits = {
        name: found.poison[1] for name in chosen if (found := adapter(name)).poison is not None
    }
    already = done_indices(results, settings) if results is not None else set()
    indices: list[int] = []
    candidate = 0
    while len(indices) < plans:
        if candidate not in already:
            indices.append(candidate)
        candidate += 1

    result = SoakResult(seed, chosen)
    seeds = random.Random(seed)  # noqa: S311 - a reproducible soak, not a secret
    plan_seeds = [seeds.randrange(2**31) for _ in range(candidate)]
    lock = threading.Lock()
    done: dict[int, ChaosReport] = {}

    def run_one(index: int) -> None:
        plan = ChaosPlan.random(
            plan_seeds[index],
            epochs,
            partitions,
            points=point_list,
            modes=mode_list,
            n=faults_per_plan,
            probability=probability,
            targets=sorted(servers),
        )
        timer = _draw_timer(plan_seeds[index], sorted(servers), timer_kills)
        disturbance = draw(
            plan_seeds[index],
            epochs,
            two_drivers=two_drivers,
            poison=poison,
            poison_limits=poison_limits,
            rows_per_epoch=-(-rows // epochs),
        )
        if disturbance is not None:  # a disturbed plan carries no fault: one story per plan
            plan, timer = ChaosPlan((), plan_seeds[index]), None
        folder = Path(workdir, f"plan-{index:04d}").resolve()
        shutil.rmtree(folder, ignore_errors=True)  # an interrupted run's, not in results
        folder.mkdir(parents=True)
        make_input(folder / "input", rows, epochs)
        variants = _draw_variants(chosen, plan_seeds[index])
        if isinstance(disturbance, Poison):
            found = adapter(disturbance.connector).poison
            if found is not None:
                variants[disturbance.connector] = {
                    **variants.get(disturbance.connector, {}),
                    **found[0],
                }
        made = new_targets(
            chosen, folder, tag=f"chaos_{seed}_{index}", env=source, options=variants
        )
        log = str(folder / "txlog")
        report = run_chaos(
            PIPELINE,
            plan,
            workdir=folder,
            sinks_verifiers={t.connector: t.verifier(range(rows), log=log) for t in made},
            args={
                "workdir": str(folder),
                "sinks": [t.spec for t in made],
                "partitions": partitions,
                "log": log,
            },
            env={**source, **child_env(made)},
            max_runs=max_runs,
            on_progress=on_progress,
            targets=servers,
            down_s=down_s,
            kill_target_after=timer,
            observe=[v for t in made for v in t.observer_targets()] if observe else (),
            expected_epochs=input_epochs(folder / "input") if observe else None,
            disturbance=disturbance,
            input_dir=folder / "input",
            audit=[t.sink() for t in made],  # txsink audit --deep at the end of each plan
        )
        with lock:
            done[index] = report
            result.reports = [done[i] for i in sorted(done)]
            if results is not None:
                _append(results, settings, index, plan_seeds[index], report)
            if on_plan is not None:
                on_plan(index, report, result)
        if prune and report.ok:
            shutil.rmtree(folder, ignore_errors=True)

    if jobs == 1 or servers:
        # Target crashes kill shared servers: plans side by side would crash each other.
        for index in indices:
            run_one(index)
    else:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="soak") as pool:
            for future in [pool.submit(run_one, i) for i in indices]:
                future.result()
    return result


def _draw_timer(
    seed: int, servers: Sequence[str], chance: float
) -> tuple[float, str | None] | None:
    """With ``chance``, a kill of one drawn server at a drawn moment (1-20 s) of the plan."""
    if not servers or chance <= 0:
        return None
    rng = random.Random(seed ^ 0x7133)  # noqa: S311 - a reproducible soak, not a secret
    if rng.random() >= chance:
        return None
    return round(rng.uniform(1.0, 20.0), 1), rng.choice(list(servers))


def _append(
    path: str | os.PathLike[str],
    settings: Mapping[str, Any],
    index: int,
    plan_seed: int,
    report: ChaosReport,
) -> None:
    line = {
        "soak": settings,
        "index": index,
        "plan_seed": plan_seed,
        "finished_at": round(time.time(), 1),
        "report": report.as_dict(),
    }
    with open(path, "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
