"""The soak: many random chaos plans, one after the other, across connectors.

Each plan gets a fresh folder, a deterministic input of ``epochs`` files, and one query
writing to every selected connector at once (one coordinator, so a plan also checks the
atomicity across sinks), run by :func:`~txsink.testing.chaos.run_chaos` under
``ChaosPlan.random(plan_seed, ...)``. The plan seeds come from ``random.Random(seed)``:
the same ``seed`` replays the same soak.

Connectors: ``files`` needs nothing; ``postgres``, ``kafka`` and ``s3`` need a server,
given by ``TXSINK_PG_DSN``, ``TXSINK_KAFKA_BOOTSTRAP`` and ``TXSINK_S3_ENDPOINT`` (with
``TXSINK_S3_ACCESS_KEY``, ``TXSINK_S3_SECRET_KEY``, ``TXSINK_S3_REGION``), the variables
``integration/services up`` writes to ``integration/.services.env``.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txsink.faults import CrashPoint, FaultMode
from txsink.testing.chaos import ChaosReport, format_table, run_chaos
from txsink.testing.plan import DEFAULT_MODES, DEFAULT_POINTS, ChaosPlan
from txsink.testing.verifiers import SinkVerifier

__all__ = ["CONNECTORS", "SoakResult", "available_connectors", "soak"]

PIPELINE = "txsink.testing.pipelines:run_stream"
CONNECTORS = ("files", "postgres", "kafka", "s3")
_SERVER_ENV = {
    "postgres": "TXSINK_PG_DSN",
    "kafka": "TXSINK_KAFKA_BOOTSTRAP",
    "s3": "TXSINK_S3_ENDPOINT",
}


def available_connectors(env: dict[str, str] | None = None) -> list[str]:
    """``files``, plus each server connector whose environment variable is set."""
    source = os.environ if env is None else env
    return ["files"] + [c for c, var in _SERVER_ENV.items() if source.get(var)]


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
                r.plan or "(no faults)",
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
) -> SoakResult:
    """Run ``plans`` random chaos plans; ``on_plan(index, report, result_so_far)`` after each.

    ``connectors`` defaults to :func:`available_connectors`. Each plan's folder
    ``workdir/plan-<i>`` is kept (input, outputs, txsink log, checkpoint, fault markers).
    ``jobs`` plans run at once (each its own queries, tables, topics and buckets; they
    share the servers and Kafka's marker topic, as pipelines in production do). The plans
    and the final order of ``reports`` depend only on ``seed``, never on ``jobs``.
    """
    if jobs < 1:
        raise ValueError(f"soak: jobs must be at least 1, not {jobs}")
    chosen = list(connectors) if connectors is not None else available_connectors()
    unknown = sorted(set(chosen) - set(CONNECTORS))
    if unknown:
        raise ValueError(f"soak: unknown connector(s) {unknown}; known: {list(CONNECTORS)}")
    missing = [c for c in chosen if c in _SERVER_ENV and not os.environ.get(_SERVER_ENV[c])]
    if missing:
        raise ValueError(
            "soak: no server for " + ", ".join(f"{c} (set {_SERVER_ENV[c]})" for c in missing)
        )
    point_list = list(points)
    mode_list = list(modes)
    from txsink.demo import make_input

    result = SoakResult(seed, chosen)
    seeds = random.Random(seed)  # noqa: S311 - a reproducible soak, not a secret
    plan_seeds = [seeds.randrange(2**31) for _ in range(plans)]
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
        )
        folder = Path(workdir, f"plan-{index:03d}").resolve()
        folder.mkdir(parents=True, exist_ok=False)
        make_input(folder / "input", rows, epochs)
        specs, verifiers, env = _sinks(chosen, folder, range(rows), f"{seed}_{index}")
        report = run_chaos(
            PIPELINE,
            plan,
            workdir=folder,
            sinks_verifiers=verifiers,
            args={"workdir": str(folder), "sinks": specs, "partitions": partitions},
            env=env,
            max_runs=max_runs,
            on_progress=on_progress,
        )
        with lock:
            done[index] = report
            result.reports = [done[i] for i in sorted(done)]
            if on_plan is not None:
                on_plan(index, report, result)

    if jobs == 1:
        for index in range(plans):
            run_one(index)
    else:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="soak") as pool:
            for future in [pool.submit(run_one, i) for i in range(plans)]:
                future.result()
    return result


def _sinks(
    connectors: Sequence[str], folder: Path, expected: range, tag: str
) -> tuple[list[dict[str, Any]], dict[str, SinkVerifier], dict[str, str]]:
    """Sink specs for the child, verifiers for the parent, and the child's extra env."""
    from txsink.testing import verifiers as v

    specs: list[dict[str, Any]] = []
    checks: dict[str, SinkVerifier] = {}
    env: dict[str, str] = {}
    unique = f"{tag}_{uuid.uuid4().hex[:8]}"
    for name in connectors:
        if name == "files":
            path = str(folder / "out-files")
            specs.append({"kind": "files", "path": path, "uid": "files"})
            checks[name] = v.FilesVerifier(path, expected, uid="files")
        elif name == "postgres":
            table = f"txsink_chaos_{unique}"
            specs.append(
                {
                    "kind": "postgres",
                    "table": table,
                    "uid": "pg",
                    "create_table": True,
                    "dsn_env": "TXSINK_PG_DSN",
                }
            )
            checks[name] = v.PostgresVerifier(
                os.environ["TXSINK_PG_DSN"],
                table,
                expected,
                uid="pg",
                log=str(folder / "txlog"),
            )
        elif name == "kafka":
            topic = f"txsink-chaos-{unique}"
            wal = str(folder / "kafka-wal")
            specs.append(
                {
                    "kind": "kafka",
                    "topic": topic,
                    "uid": "kafka",
                    "wal": wal,
                    "bootstrap_env": "TXSINK_KAFKA_BOOTSTRAP",
                    # Plans are separate pipelines: each its own transactional ids, or
                    # concurrent plans (--jobs) would fence each other.
                    "transactional_id_prefix": f"txsink-{unique}",
                }
            )
            from txsink.testing._kafka import create_topic

            create_topic(os.environ["TXSINK_KAFKA_BOOTSTRAP"], topic)
            checks[name] = v.KafkaVerifier(
                os.environ["TXSINK_KAFKA_BOOTSTRAP"], topic, expected, wal=wal
            )
        elif name == "s3":
            options = _s3_options()
            bucket = f"txsink-chaos-{unique}".replace("_", "-").lower()[:63]
            from txsink._s3 import make_client

            make_client(options).create_bucket(Bucket=bucket)
            url = f"s3://{bucket}/out"
            specs.append({"kind": "s3", "url": url, "uid": "s3"})
            checks[name] = v.S3Verifier(url, expected, uid="s3", client_options=options)
            env.update(
                AWS_ACCESS_KEY_ID=options["aws_access_key_id"],
                AWS_SECRET_ACCESS_KEY=options["aws_secret_access_key"],
                AWS_ENDPOINT_URL_S3=options["endpoint_url"],
                AWS_DEFAULT_REGION=options["region_name"],
            )
    return specs, checks, env


def _s3_options() -> dict[str, str]:
    return {
        "endpoint_url": os.environ["TXSINK_S3_ENDPOINT"],
        "aws_access_key_id": os.environ.get("TXSINK_S3_ACCESS_KEY", ""),
        "aws_secret_access_key": os.environ.get("TXSINK_S3_SECRET_KEY", ""),
        "region_name": os.environ.get("TXSINK_S3_REGION", "us-east-1"),
    }
