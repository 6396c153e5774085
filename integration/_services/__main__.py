"""Command line: ``integration/services up|down|status`` (see the wrapper script's header)."""

from __future__ import annotations

import argparse
import signal
import sys

from .common import ENV_FILE, LOG_DIR, ServiceError, cache_dir
from .manager import NOT_DEFAULT, SERVICES, down, printable, status, up


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `services up | head` must not traceback
    parser = argparse.ArgumentParser(
        prog="integration/services",
        description=(
            "Local PostgreSQL, Kafka (KRaft), S3 and Schema Registry servers for txsink"
            " integration tests."
        ),
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start services (idempotent) and write the env file")
    p_up.add_argument("services", nargs="*", metavar="service", help=", ".join(SERVICES))
    p_down = sub.add_parser("down", help="stop services by their pid files")
    p_down.add_argument("services", nargs="*", metavar="service", help=", ".join(SERVICES))
    p_down.add_argument("--purge", action="store_true", help="also delete their data folders")
    sub.add_parser("status", help="show which services run and answer")
    args = parser.parse_args(argv)

    if args.cmd == "up":
        try:
            env, reports = up(args.services)
        except ServiceError as exc:
            print(f"integration/services up failed:\n{exc}", file=sys.stderr)
            print(f"logs: {LOG_DIR}", file=sys.stderr)
            return 1
        print(f"{'service':14s} start-up")
        for r in reports:
            print(f"{r.name:14s} {r.describe()}")
        for key, value in sorted(env.items()):
            print(printable(key, value))
        print(f"# env written to {ENV_FILE}; logs in {LOG_DIR}; cache in {cache_dir()}")
        return 0
    if args.cmd == "down":
        try:
            stopped = down(args.services, purge=args.purge)
        except ServiceError as exc:
            print(f"integration/services down failed: {exc}", file=sys.stderr)
            return 1
        print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
        return 0
    rows = status()
    for name, health, env in rows:
        where = " ".join(printable(k, v) for k, v in sorted(env.items()) if "SECRET" not in k)
        print(f"{name:9s} {health:24s} {where}")
    # A service outside the default set (started only when named) may be stopped.
    fine = [h == "healthy" or (n in NOT_DEFAULT and h == "stopped") for n, h, _ in rows]
    return 0 if all(fine) else 3


if __name__ == "__main__":
    sys.exit(main())
