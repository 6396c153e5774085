"""An S3-compatible server: MinIO built with ``go install`` (default), or moto in server mode.

Why MinIO first: moto answers some edge cases differently from real S3 (a second
``CompleteMultipartUpload`` succeeds, a complete after abort is HTTP 500), and the S3 sink's
idempotent commit depends on exactly those answers. MinIO is built from source once
(about 3 minutes cold on 2 cores) and the binary is cached; the Go build caches are deleted
afterwards. If Go is missing or the build fails, we fall back to moto and say so.

``TXSINK_S3_SERVER`` picks the server: ``auto`` (default: MinIO, else moto), ``minio``
(fail if it cannot be built), ``moto``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from .base import LocalService
from .common import (
    LOG_DIR,
    LOOPBACK,
    WORK_DIR,
    ServiceError,
    StartReport,
    cache_dir,
    choose_port,
    ensure_dirs,
    log,
    pid_alive,
    port_open,
    read_pid,
    run,
    spawn,
    stop_pid,
    tail_file,
    wait_until,
    write_pid,
)

# github.com/minio/minio tags are not semver, so Go addresses a commit by pseudo-version.
MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
DEFAULT_PORT = 59000
DEFAULT_CONSOLE_PORT = 59001
ACCESS_KEY = "txsink"
SECRET_KEY = "txsink-secret"  # fixed test credential, loopback only (MinIO wants >= 8 chars)
REGION = "us-east-1"

S3_DIR = WORK_DIR / "s3"
DATA_DIR = S3_DIR / "data"
LOG_FILE = LOG_DIR / "s3.log"
BUILD_LOG = LOG_DIR / "minio-build.log"


def minio_binary() -> Path:
    return cache_dir() / "minio" / MINIO_VERSION / "bin" / "minio"


def find_go() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    return str(fallback) if fallback.exists() else None


def build_minio(report: StartReport) -> Path:
    """``go install`` the pinned MinIO once; keep only the binary (the Go caches are ~2 GB)."""
    binary = minio_binary()
    if binary.exists():
        return binary
    go = find_go()
    if go is None:
        raise ServiceError("Go is not installed, cannot build MinIO")
    timeout = float(os.environ.get("TXSINK_MINIO_BUILD_TIMEOUT", "1200"))
    go_cache = cache_dir() / "go"
    env = {
        "GOBIN": str(binary.parent),
        "GOMODCACHE": str(go_cache / "mod"),
        "GOCACHE": str(go_cache / "build"),
        "GOFLAGS": "-buildvcs=false -modcacherw",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
    }
    log(f"s3: building MinIO {MINIO_VERSION} with go install (a few minutes, once)")
    t0 = time.monotonic()
    run(
        [go, "install", "-trimpath", "-ldflags=-s -w", f"{MINIO_MODULE}@{MINIO_VERSION}"],
        env=env,
        timeout=timeout,
        log_path=BUILD_LOG,
    )
    report.cold = True
    report.provision_seconds += time.monotonic() - t0
    report.notes.append(f"MinIO built in {time.monotonic() - t0:.0f}s")
    if os.environ.get("TXSINK_KEEP_GO_CACHE") != "1":
        shutil.rmtree(go_cache, ignore_errors=True)
    if not binary.exists():
        raise ServiceError(f"go install succeeded but {binary} is missing")
    return binary


def _boto_healthy(port: int) -> bool:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/", timeout=3):
                return True
        except Exception:
            return False
    client = boto3.client(
        "s3",
        endpoint_url=f"http://{LOOPBACK}:{port}",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}),
    )
    try:
        client.list_buckets()
        return True
    except Exception:
        return False


class S3(LocalService):
    name = "s3"

    def _marker(self, state: dict[str, Any]) -> str:
        if state.get("server") == "moto":
            return f"moto.server -H {LOOPBACK} -p {state.get('port')}"
        return str(DATA_DIR)

    def running(self, state: dict[str, Any]) -> bool:
        pid = read_pid(self.name)
        return pid is not None and pid_alive(pid, self._marker(state))

    def healthy(self, state: dict[str, Any]) -> bool:
        port = state.get("port")
        return isinstance(port, int) and port_open(port) and _boto_healthy(port)

    def env(self, state: dict[str, Any]) -> dict[str, str]:
        return {
            "TXSINK_S3_ENDPOINT": f"http://{LOOPBACK}:{state['port']}",
            "TXSINK_S3_ACCESS_KEY": ACCESS_KEY,
            "TXSINK_S3_SECRET_KEY": SECRET_KEY,
            "TXSINK_S3_REGION": REGION,
            # Lets tests expect the server's known deviations (see docs/testing.md).
            "TXSINK_S3_SERVER": str(state["server"]),
        }

    def _start_minio(self, binary: Path, state: dict[str, Any]) -> int:
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        proc = spawn(
            [
                str(binary),
                "server",
                "--quiet",
                "--address",
                f"{LOOPBACK}:{state['port']}",
                "--console-address",
                f"{LOOPBACK}:{state['console_port']}",
                str(DATA_DIR),
            ],
            LOG_FILE,
            env={
                "MINIO_ROOT_USER": ACCESS_KEY,
                "MINIO_ROOT_PASSWORD": SECRET_KEY,
                "MINIO_BROWSER": "off",
                "MINIO_UPDATE": "off",
                "MINIO_REGION": REGION,
            },
            cwd=S3_DIR,
        )
        return proc.pid

    def _start_moto(self, state: dict[str, Any]) -> int:
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
            raise ServiceError(
                "moto server mode needs moto[server] in the venv: pip install 'moto[server]>=5'"
            )
        S3_DIR.mkdir(parents=True, exist_ok=True)
        proc = spawn(
            [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(state["port"])],
            LOG_FILE,
            cwd=S3_DIR,
        )
        return proc.pid

    def up(self, state: dict[str, Any], taken_ports: set[int]) -> StartReport:
        t0 = time.monotonic()
        ensure_dirs()
        report = StartReport(self.name, {})
        if state.get("server") and self.running(state) and self.healthy(state):
            report.already_running = True
            report.notes.append(str(state["server"]))
            report.env = self.env(state)
            report.seconds = time.monotonic() - t0
            return report
        if state.get("server") and self.running(state):
            log("s3: running but not answering; restarting it")
            self.down(state)
        choice = os.environ.get("TXSINK_S3_SERVER", "auto").strip().lower() or "auto"
        if choice not in {"auto", "minio", "moto"}:
            raise ServiceError(f"TXSINK_S3_SERVER must be auto, minio or moto, not {choice!r}")
        server = "moto" if choice == "moto" else "minio"
        binary: Path | None = None
        if server == "minio":
            try:
                binary = build_minio(report)
            except ServiceError as exc:
                if choice == "minio":
                    raise
                log(f"s3: MinIO unavailable ({str(exc).splitlines()[0]}); falling back to moto")
                report.notes.append("MinIO build failed, moto fallback")
                server = "moto"
        state["server"] = server
        for key, default in (("port", DEFAULT_PORT), ("console_port", DEFAULT_CONSOLE_PORT)):
            port = choose_port(default, state.get(key), taken_ports)
            if port != default:
                report.notes.append(f"{key} {default} taken, using {port}")
            state[key] = port
        pid = self._start_minio(binary, state) if binary is not None else self._start_moto(state)
        write_pid(self.name, pid)
        try:
            wait_until(
                f"{server} health check",
                lambda: self.healthy(state),
                120,
                alive=lambda: pid_alive(pid),
            )
        except ServiceError as exc:
            raise ServiceError(f"{exc}\n--- {LOG_FILE}:\n{tail_file(LOG_FILE)}") from exc
        report.notes.insert(0, server)
        report.env = self.env(state)
        report.seconds = time.monotonic() - t0
        return report

    def down(self, state: dict[str, Any]) -> bool:
        pid = read_pid(self.name)
        if pid is None:
            return False
        return stop_pid(pid, self._marker(state), timeout=30)
