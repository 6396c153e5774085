"""The long soak with target crashes, against servers of its own (resumable).

    integration/services up                   # once: the binaries and jars it reuses
    .venv/bin/python integration/crash_soak.py --plans 100 --seed 2000 \\
        --results integration/soak-results.jsonl
    # PostgreSQL as it ships (no prepared transactions): the staging commit
    .venv/bin/python integration/crash_soak.py --stock-postgres --connectors files,postgres,kafka \\
        --plans 40 --seed 3900 --results integration/soak-stock.jsonl

It starts a private PostgreSQL cluster, MinIO server and Kafka broker
(:mod:`crashable_targets`; the shared test servers are never touched, so tests can run
beside it), points every connector at them (Iceberg's SQL catalog on that PostgreSQL, its
warehouse on that MinIO), and runs :func:`txsink.testing.soak` with ``kill-target`` among
the modes: a plan may SIGKILL one of the three servers at a crash point, or (``--timer``)
at a random moment, keep it down, and start it again before the query restarts. Each
plan is appended to ``--results`` as it ends; the next run with the same file and seed
continues where this one stopped (``txsink chaos tally FILE`` prints the tables).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from crashable_targets import CrashableKafka, CrashableMinio, CrashablePostgres

from txsink.testing.chaos.soak import soak
from txsink.testing.chaos.soaklog import summary

CONNECTORS = "files,postgres,kafka,s3,iceberg,delta"
MODES = "raise,kill-driver,kill-worker,kill-target"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", type=int, default=10)
    parser.add_argument("--seed", type=int, default=2000)
    parser.add_argument("--results", type=Path, default=Path("integration/soak-results.jsonl"))
    parser.add_argument("--connectors", default=CONNECTORS)
    parser.add_argument("--modes", default=MODES)
    parser.add_argument("--timer", type=float, default=0.2, help="chance of a random-moment kill")
    parser.add_argument("--down", type=float, default=2.0)
    parser.add_argument(
        "--two-drivers", type=float, default=0.1, help="chance of a second-driver plan"
    )
    parser.add_argument("--poison", type=float, default=0.1, help="chance of a poison-record plan")
    parser.add_argument(
        "--stock-postgres",
        action="store_true",
        help="start PostgreSQL as it ships (max_prepared_transactions = 0): the Postgres sinks "
        "take the staging commit (commit='auto')",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    # SIGTERM (a `kill`, a CI's timeout) ends the soak through its `finally`: the private
    # servers are stopped, not left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    from txsink.spark.jvmcds import ensure_archive

    ensure_archive()  # every plan's runs start drivers: ~5 s faster each
    base = Path(args.workdir or tempfile.mkdtemp(prefix="txsink-crash-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    started = time.time()
    pg = (
        CrashablePostgres.create(max_prepared=0)
        if args.stock_postgres
        else CrashablePostgres.create()
    )
    minio = CrashableMinio.create(base / "minio")
    kafka = CrashableKafka.create(base / "kafka")
    try:
        env = {
            **os.environ,
            "TXSINK_PG_DSN": pg.dsn,
            "TXSINK_KAFKA_BOOTSTRAP": kafka.bootstrap,
            **minio.env(),
        }
        for var in ("TXSINK_KAFKA_PROXY_LISTEN", "TXSINK_KAFKA_PROXY_TARGET"):
            env.pop(var, None)
        print(
            f"crash soak: {args.plans} plan(s), seed {args.seed}, servers postgres {pg.port} "
            f"(max_prepared_transactions {pg.max_prepared}), "
            f"minio {minio.port}, kafka {kafka.port}; results {args.results}",
            flush=True,
        )

        def on_plan(index: int, report: object, result: object) -> None:
            from txsink.testing.chaos import ChaosReport
            from txsink.testing.chaos.soak import SoakResult

            assert isinstance(report, ChaosReport) and isinstance(result, SoakResult)
            kills = f" servers: {'; '.join(report.target_kills)}" if report.target_kills else ""
            what = report.plan or report.disturbance or "-"
            print(
                f"[{len(result.reports)}/{args.plans}] plan {index} {what}: "
                f"{'ok' if report.ok else 'FAIL'} {report.restarts} restart(s) "
                f"{report.seconds:.0f}s{kills} | {result.tally()}",
                flush=True,
            )
            if not report.ok:
                print(report.table(), flush=True)

        result = soak(
            args.plans,
            args.seed,
            workdir=base / "plans",
            connectors=args.connectors.split(","),
            modes=args.modes.split(","),
            env=env,
            targets={"postgres": pg, "s3": minio, "kafka": kafka},
            down_s=args.down,
            timer_kills=args.timer,
            results=args.results,
            prune=True,
            two_drivers=args.two_drivers,
            poison=args.poison,
            on_plan=on_plan,
            on_progress=(lambda line: print(line, flush=True)) if args.verbose else None,
        )
    finally:
        kafka.stop()
        minio.stop()
        pg.stop()
    print(result.tally(), f"in {time.time() - started:.0f}s", flush=True)
    print(summary(args.results), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
