"""An S3-compatible server: MinIO built with ``go install`` (default), or moto in server mode.

Why MinIO first: moto answers some edge cases differently from real S3 (a second
``CompleteMultipartUpload`` succeeds, a complete after abort is HTTP 500), and the S3 sink's
idempotent commit depends on exactly those answers. MinIO is built from source once
(about 3 minutes cold on 2 cores) and the binary is cached; the Go build caches are deleted
afterwards. If Go is missing or the build fails, we fall back to moto and say so, except
under ``CI=true``, where that is an error: CI tests against the real server or fails.

``TXSINK_S3_SERVER`` picks the server: ``auto`` (default: MinIO, else moto; under CI
MinIO only), ``minio`` (fail if it cannot be built), ``moto``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

from .base import LocalService
from .common import (
    LOG_DIR,
    LOOPBACK,
    WORK_DIR,
    ServiceError,
    StartReport,
    cache_dir,
    cache_lock,
    log,
    port_open,
    real_servers_required,
)
from .gobuild import go_build

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


def build_minio(report: StartReport) -> Path:
    """``go install`` the pinned MinIO once; keep only the binary (the Go caches are ~2 GB)."""
    binary = minio_binary()
    if binary.exists():
        return binary
    with cache_lock("minio"):  # a second cold `up` waits, then finds the binary
        if binary.exists():
            return binary
        log(f"s3: building MinIO {MINIO_VERSION} with go install (a few minutes, once)")
        staging = binary.parent.with_name("bin.partial")
        shutil.rmtree(staging, ignore_errors=True)
        built = go_build(
            "MinIO",
            ["install", "-trimpath", "-ldflags=-s -w", f"{MINIO_MODULE}@{MINIO_VERSION}"],
            report=report,
            go_cache=cache_dir() / "go",
            timeout_var="TXSINK_MINIO_BUILD_TIMEOUT",
            log_path=BUILD_LOG,
            env={
                "GOBIN": str(staging),
                "GOFLAGS": "-buildvcs=false -modcacherw",
                "GOTOOLCHAIN": "local",
            },
        )
        if not (staging / "minio").exists():
            raise ServiceError(f"go install succeeded but {staging / 'minio'} is missing")
        # An interrupted build never leaves a binary that looks complete.
        binary.parent.mkdir(parents=True, exist_ok=True)
        (staging / "minio").replace(binary)
        shutil.rmtree(staging, ignore_errors=True)
        report.notes.append(f"MinIO built in {built:.0f}s")
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


def minio_command(
    binary: Path, state: dict[str, Any], data: Path, certs: Path | None = None
) -> list[str]:
    """MinIO's server on the state's ports, serving ``data`` (``certs``: its TLS folder,
    ``public.crt`` and ``private.key``; none: plain HTTP). Shared with :mod:`.s3_secure`."""
    tls = ["--certs-dir", str(certs)] if certs is not None else []
    return [
        str(binary),
        "server",
        "--quiet",
        *tls,
        "--address",
        f"{LOOPBACK}:{state['port']}",
        "--console-address",
        f"{LOOPBACK}:{state['console_port']}",
        str(data),
    ]


def minio_env(root_user: str, root_password: str) -> dict[str, str]:
    """MinIO's environment: its root user, no console, no update check, the region."""
    return {
        "MINIO_ROOT_USER": root_user,
        "MINIO_ROOT_PASSWORD": root_password,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
        "MINIO_REGION": REGION,
    }


class S3(LocalService):
    name = "s3"
    default_ports: ClassVar[dict[str, int]] = {
        "port": DEFAULT_PORT,
        "console_port": DEFAULT_CONSOLE_PORT,
    }
    start_timeout = 120.0
    logs = ((LOG_FILE, 25),)

    def marker(self, state: dict[str, Any]) -> str:
        if state.get("server") == "moto":
            return f"moto.server -H {LOOPBACK} -p {state.get('port')}"
        return str(DATA_DIR)

    def running(self, state: dict[str, Any]) -> bool:
        # Without its flavour in the state the server is not one `up` started.
        return bool(state.get("server")) and super().running(state)

    def running_notes(self, state: dict[str, Any]) -> list[str]:
        return [str(state["server"])]

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

    def start(self, state: dict[str, Any], taken_ports: set[int], report: StartReport) -> None:
        choice = os.environ.get("TXSINK_S3_SERVER", "auto").strip().lower() or "auto"
        if choice not in {"auto", "minio", "moto"}:
            raise ServiceError(f"TXSINK_S3_SERVER must be auto, minio or moto, not {choice!r}")
        server = "moto" if choice == "moto" else "minio"
        binary: Path | None = None
        if server == "minio":
            try:
                binary = build_minio(report)
            except ServiceError as exc:
                if choice == "minio" or real_servers_required():
                    why = "under CI=true the real server is required" if choice != "minio" else ""
                    raise ServiceError(f"{exc}{'; ' + why if why else ''}") from exc
                log(f"s3: MinIO unavailable ({str(exc).splitlines()[0]}); falling back to moto")
                report.notes.append("MinIO build failed, moto fallback")
                server = "moto"
        state["server"] = server
        self.assign_ports(state, taken_ports, report)
        if binary is not None:
            self._start_minio(binary, state)
        else:
            self._start_moto(state)
        report.notes.insert(0, server)

    def _start_minio(self, binary: Path, state: dict[str, Any]) -> None:
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        self.launch(
            minio_command(binary, state, DATA_DIR),
            state,
            LOG_FILE,
            env=minio_env(ACCESS_KEY, SECRET_KEY),
            cwd=S3_DIR,
            what="minio",
        )

    def _start_moto(self, state: dict[str, Any]) -> None:
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
            raise ServiceError(
                "moto server mode needs moto[server] in the venv: pip install 'moto[server]>=5'"
            )
        S3_DIR.mkdir(parents=True, exist_ok=True)
        self.launch(
            [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(state["port"])],
            state,
            LOG_FILE,
            cwd=S3_DIR,
            what="moto",
        )
