"""``up`` / ``down`` / ``status`` over all local services, plus the env file the tests read."""

from __future__ import annotations

import shlex
import shutil
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .base import LocalService
from .common import (
    ENV_FILE,
    LOG_DIR,
    PID_DIR,
    WORK_DIR,
    ServiceError,
    StartReport,
    load_state,
    locked,
    log,
    redact,
    save_state,
)
from .kafka import Kafka
from .postgres import Postgres
from .registry import Registry
from .s3 import S3

SERVICES: dict[str, LocalService] = {s.name: s for s in (Postgres(), Kafka(), S3(), Registry())}
SECRET_KEYS = {"TXSINK_S3_SECRET_KEY"}


def _select(names: Iterable[str]) -> list[str]:
    chosen = list(names) or list(SERVICES)
    unknown = [n for n in chosen if n not in SERVICES]
    if unknown:
        raise ServiceError(f"unknown service(s) {unknown}; choose from {sorted(SERVICES)}")
    return chosen


def printable(key: str, value: str) -> str:
    """An env line safe for a terminal or CI log: passwords and secret keys hidden."""
    if key in SECRET_KEYS:
        return f"{key}=*** (in {ENV_FILE.name})"
    return f"{key}={redact(value)}"


def _write_env_file(state: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for name, svc in SERVICES.items():
        sub = state.get(name)
        if isinstance(sub, dict) and sub and svc.running(sub):
            env.update(svc.env(sub))
    if not env:
        ENV_FILE.unlink(missing_ok=True)
        return env
    lines = ["# written by integration/services up; sourceable by bash (set -a; . file)"]
    lines += [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    tmp = ENV_FILE.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(0o600)
    tmp.replace(ENV_FILE)
    return env


def up(names: Sequence[str] = ()) -> tuple[dict[str, str], list[StartReport]]:
    """Start the named services (all by default), in parallel; return their env and reports.

    Raises ServiceError naming every service that failed, after starting the others.
    """
    chosen = _select(names)
    with locked():
        state = load_state()
        subs: dict[str, dict[str, Any]] = {}
        for name in chosen:
            sub = state.get(name)
            subs[name] = sub if isinstance(sub, dict) else {}

        def start(name: str) -> StartReport:
            others: set[int] = set()
            for other, svc in SERVICES.items():
                other_state = state.get(other)
                if other != name and isinstance(other_state, dict):
                    others |= svc.ports(other_state)
            return SERVICES[name].up(subs[name], others)

        reports: list[StartReport] = []
        errors: list[str] = []
        with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
            futures = {name: pool.submit(start, name) for name in chosen}
            for name, fut in futures.items():
                try:
                    reports.append(fut.result())
                except Exception as exc:
                    errors.append(f"{name}: {redact(str(exc))}")
                state[name] = subs[name]
        save_state(state)
        env = _write_env_file(state)
        _record_timings(reports)
    if errors:
        raise ServiceError("\n".join(errors))
    return env, reports


def _record_timings(reports: list[StartReport]) -> None:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    with (LOG_DIR / "timings.log").open("a") as fh:
        for r in reports:
            fh.write(f"{stamp} {r.name:9s} {r.describe()}\n")


def down(names: Sequence[str] = (), *, purge: bool = False) -> list[str]:
    """Stop the named services (all by default); with ``purge`` also delete their data."""
    chosen = _select(names)
    stopped: list[str] = []
    with locked():
        state = load_state()
        for name in chosen:
            sub = state.get(name)
            sub = sub if isinstance(sub, dict) else {}
            try:
                if SERVICES[name].down(sub):
                    stopped.append(name)
            except Exception as exc:
                log(f"{name}: stop failed: {redact(str(exc))}")
            (PID_DIR / f"{name}.pid").unlink(missing_ok=True)
            if purge:
                target = WORK_DIR / name
                if target.is_symlink():  # postgres as root lives outside the checkout
                    shutil.rmtree(target.resolve(), ignore_errors=True)
                    target.unlink()
                shutil.rmtree(target, ignore_errors=True)
                state.pop(name, None)
        save_state(state)
        _write_env_file(state)
    return stopped


def status() -> list[tuple[str, str, dict[str, str]]]:
    """(name, "healthy" | "running, not answering" | "stopped", env) per service."""
    state = load_state()
    rows: list[tuple[str, str, dict[str, str]]] = []
    for name, svc in SERVICES.items():
        sub = state.get(name)
        sub = sub if isinstance(sub, dict) else {}
        if sub and svc.running(sub):
            health = "healthy" if svc.healthy(sub) else "running, not answering"
            rows.append((name, health, svc.env(sub)))
        else:
            rows.append((name, "stopped", {}))
    return rows
