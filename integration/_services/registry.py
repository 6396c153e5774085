"""A Confluent-API-compatible Schema Registry: AxonOps Schema Registry, built from source with Go.

Why this one: Confluent's own registry is neither on Maven Central nor on PyPI, Karapace is
not on PyPI, and Conduit's registry is a Go library without a server binary (and lacks
``GET /subjects``, lookup and delete). AxonOps Schema Registry (Apache-2.0, Go) implements
the Confluent REST API and ships tests that drive it with confluent-kafka-python's
serializers. It is fetched through the Go module proxy at a pinned release and built once
(about a minute cold on 2 cores); the binary is cached, the Go build caches are deleted.

Storage is the server's in-memory backend (its default, covered by the upstream storage
conformance suite): nothing to set up, but every start is an empty registry and schema ids
start again at 1. Tests therefore never rely on schemas surviving a ``down``.

Known differences from Confluent's registry, seen with confluent-kafka 2.16: ``GET
/subjects`` on an empty registry answers ``null`` instead of ``[]`` (so
``SchemaRegistryClient.get_subjects()`` returns ``None``); the health check accepts both.
"""

from __future__ import annotations

import json
import shutil
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
)
from .gobuild import go_build

REGISTRY_MODULE = "github.com/axonops/axonops-schema-registry"
REGISTRY_PACKAGE = f"{REGISTRY_MODULE}/cmd/schema-registry"
REGISTRY_VERSION = "v0.2.1"
GO_VERSION = "1.26.0"  # the module's own go directive; an older local Go fetches this toolchain
DEFAULT_PORT = 58081
COMPATIBILITY = "BACKWARD"  # Confluent's default

REGISTRY_DIR = WORK_DIR / "registry"
CONFIG = REGISTRY_DIR / "config.yaml"
LOG_FILE = LOG_DIR / "registry.log"
BUILD_LOG = LOG_DIR / "registry-build.log"


def registry_binary() -> Path:
    return cache_dir() / "schema-registry" / REGISTRY_VERSION / "bin" / "schema-registry"


def build_registry(report: StartReport) -> Path:
    """Build the pinned release once; keep only the binary.

    Not ``go install module@version``: that also asks the proxy for the module's version
    list (to look for a deprecation notice), which some proxies refuse, failing the build.
    A throw-away module requiring the pinned version builds the same dependency versions
    (the registry's go.mod decides them, checked against sum.golang.org).
    """
    binary = registry_binary()
    if binary.exists():
        return binary
    with cache_lock("schema-registry"):  # a second cold `up` waits, then finds the binary
        if binary.exists():
            return binary
        return _build_registry(binary, report)


def _build_registry(binary: Path, report: StartReport) -> Path:
    work = binary.parent.parent / "build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    binary.parent.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(
        f"module txsink.local/registry-build\n\ngo {GO_VERSION}\n\n"
        f"require {REGISTRY_MODULE} {REGISTRY_VERSION}\n"
    )
    log(f"registry: building {REGISTRY_MODULE} {REGISTRY_VERSION} with go build (once)")
    partial = binary.with_name(binary.name + ".partial")
    built = go_build(
        "the schema registry",
        [
            "build",
            "-trimpath",
            f"-ldflags=-s -w -X main.version={REGISTRY_VERSION}",
            "-o",
            str(partial),
            REGISTRY_PACKAGE,
        ],
        report=report,
        # Not the MinIO build's folder: a parallel cold `up` deletes that one when MinIO is done.
        go_cache=cache_dir() / "go-registry",
        timeout_var="TXSINK_REGISTRY_BUILD_TIMEOUT",
        log_path=BUILD_LOG,
        env={"GOFLAGS": "-buildvcs=false -modcacherw -mod=mod", "GOTOOLCHAIN": "auto"},
        cwd=work,
    )
    partial.replace(binary)  # an interrupted build never leaves a binary that looks complete
    report.notes.append(f"built in {built:.0f}s")
    shutil.rmtree(work, ignore_errors=True)
    return binary


def subjects(url: str, timeout: float = 3.0) -> list[str]:
    """``GET /subjects``; an empty registry may answer ``null`` (see the module docstring)."""
    with urllib.request.urlopen(f"{url}/subjects", timeout=timeout) as resp:
        body = json.loads(resp.read() or b"null")
    if body is None:
        return []
    if not isinstance(body, list):
        raise ServiceError(f"GET {url}/subjects answered {body!r}, not a list")
    return [str(s) for s in body]


class Registry(LocalService):
    name = "registry"
    default_ports: ClassVar[dict[str, int]] = {"port": DEFAULT_PORT}
    logs = ((LOG_FILE, 25),)

    def marker(self, state: dict[str, Any]) -> str:
        return str(CONFIG)

    def _url(self, state: dict[str, Any]) -> str:
        return f"http://{LOOPBACK}:{state['port']}"

    def healthy(self, state: dict[str, Any]) -> bool:
        port = state.get("port")
        if not isinstance(port, int) or not port_open(port):
            return False
        try:
            subjects(self._url(state))
        except Exception:
            return False
        return True

    def env(self, state: dict[str, Any]) -> dict[str, str]:
        return {"TXSINK_SCHEMA_REGISTRY_URL": self._url(state)}

    def _settings(self, state: dict[str, Any]) -> dict[str, str]:
        # The server lets SCHEMA_REGISTRY_* variables override its config file, so we set
        # them too: a value inherited from the caller's shell must not move or reconfigure it.
        return {
            "SCHEMA_REGISTRY_HOST": LOOPBACK,
            "SCHEMA_REGISTRY_PORT": str(state["port"]),
            "SCHEMA_REGISTRY_STORAGE_TYPE": "memory",
            "SCHEMA_REGISTRY_COMPATIBILITY_LEVEL": COMPATIBILITY,
            "SCHEMA_REGISTRY_LOG_LEVEL": "info",
            "SCHEMA_REGISTRY_DOCS_ENABLED": "false",
        }

    def _write_config(self, state: dict[str, Any]) -> None:
        REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
        CONFIG.write_text(
            "# written by integration/services up; SCHEMA_REGISTRY_* env vars hold the same\n"
            "server:\n"
            f"  host: {LOOPBACK}\n"
            f"  port: {state['port']}\n"
            "storage:\n"
            "  type: memory\n"
            "compatibility:\n"
            f"  default_level: {COMPATIBILITY}\n"
            "logging:\n"
            "  level: info\n"
            "  format: json\n"
        )

    def start(self, state: dict[str, Any], taken_ports: set[int], report: StartReport) -> None:
        binary = build_registry(report)
        self.assign_ports(state, taken_ports, report)
        self._write_config(state)
        self.launch(
            [str(binary), "-config", str(CONFIG)],
            state,
            LOG_FILE,
            env=self._settings(state),
            cwd=REGISTRY_DIR,
        )
        report.notes.insert(0, f"axonops {REGISTRY_VERSION}, in-memory")
