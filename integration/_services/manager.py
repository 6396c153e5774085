"""``up`` / ``down`` / ``status`` over all local services, plus the env file the tests read."""

from __future__ import annotations

import contextlib
import shlex
import shutil
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .base import LocalService
from .common import (
    ENV_FILE,
    LOCK_FILE,
    LOG_DIR,
    PID_DIR,
    WORK_DIR,
    ServiceError,
    StartReport,
    load_state,
    locked,
    log,
    redact,
    release_ports,
    save_state,
)
from .kafka import Kafka
from .kafka_secure import KafkaSecure
from .postgres import Postgres, PostgresStock
from .postgres_secure import PostgresSecure
from .registry import Registry
from .registry_secure import RegistrySecure
from .s3 import S3
from .s3_secure import S3Secure

SERVICES: dict[str, LocalService] = {
    s.name: s
    for s in (
        Postgres(),
        Kafka(),
        S3(),
        Registry(),
        PostgresStock(),
        PostgresSecure(),
        KafkaSecure(),
        S3Secure(),
        RegistrySecure(),
    )
}
#: Started only when named (``up postgres_secure``), not by a bare ``up``.
NOT_DEFAULT = {"postgres_secure", "s3_secure", "registry_secure"}
SECRET_KEYS = {"TXSINK_S3_SECRET_KEY"}
#: Log files a service's ``up`` writes begin with its name, or with one of these.
_LOG_PREFIXES = {
    "s3": ("s3.", "minio"),  # not s3_secure*
    "postgres": ("postgres-",),
    "kafka": ("kafka.", "kafka-"),  # not kafka_secure*
    "registry": ("registry.", "registry-"),  # not registry_secure*
}
#: A cluster started by hand (``integration/cluster.py up``) records itself here.
_CLUSTER_STATE = WORK_DIR / "cluster" / "state.json"


def _select(names: Iterable[str], *, every: bool = False) -> list[str]:
    """The named services; none named: the default set (``every``: all of them)."""
    chosen = list(names) or [n for n in SERVICES if every or n not in NOT_DEFAULT]
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
    """Stop the named services (all by default); with ``purge`` also delete their data and
    logs, and once no service is left, everything ``up`` made: the work folder itself."""
    chosen = _select(names, every=True)
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
                _purge(name)
                release_ports(SERVICES[name].ports(sub))
                state.pop(name, None)
        save_state(state)
        _write_env_file(state)
        everything = purge and not any(name in state for name in SERVICES)
        if everything:
            _empty_work_dir()
    if everything:
        # After the lock is released: its file goes last, then the folder if nothing else
        # (a concurrent ``up``) has written to it meanwhile.
        LOCK_FILE.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            WORK_DIR.rmdir()
    return stopped


def _purge(name: str) -> None:
    """Delete a service's data folder (and, for one kept outside the work folder, the
    folders made to hold it) and its logs."""
    target = WORK_DIR / name
    if target.is_symlink():  # postgres as root lives in /var/lib/txsink-services/<key>/
        outside = target.resolve()
        shutil.rmtree(outside, ignore_errors=True)
        target.unlink()
        for folder in (outside.parent, outside.parent.parent):  # <key>/, then the root
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty: other checkouts' clusters stay
    shutil.rmtree(target, ignore_errors=True)
    for prefix in _LOG_PREFIXES.get(name, (name,)):
        for path in LOG_DIR.glob(f"{prefix}*"):
            path.unlink(missing_ok=True)


def _empty_work_dir() -> None:
    """Remove everything in the work folder but the lock (held by the caller): the logs,
    pid files and state, and a test run's Spark cluster folder, unless a cluster started by
    hand is recorded there. The compatibility matrix's results (``matrix/``, written by
    ``./dev matrix``; docs/compatibility.md is generated from them) stay."""
    for path in WORK_DIR.iterdir():
        if path == LOCK_FILE or path.name == "matrix":
            continue
        if path == _CLUSTER_STATE.parent and _CLUSTER_STATE.exists():
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


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
