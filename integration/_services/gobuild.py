"""Building a server from Go source once (MinIO, the schema registry), caches thrown away.

The Go module and build caches of one build run to a few GB: they live in a folder of
their own under the user cache and are deleted after the build unless
``TXSINK_KEEP_GO_CACHE=1``. Only the binary is kept.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .common import ServiceError, StartReport, run


def find_go() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    return str(fallback) if fallback.exists() else None


def go_build(
    what: str,
    args: Sequence[str],
    *,
    report: StartReport,
    go_cache: Path,
    timeout_var: str,
    log_path: Path,
    env: Mapping[str, str],
    cwd: Path | None = None,
) -> float:
    """Run ``go <args>`` (building ``what``) with its caches in ``go_cache``; the seconds it
    took, also counted in ``report`` as a cold start.

    ``timeout_var`` names the variable that can raise the 1200 s limit; ``env`` adds to the
    cache locations and ``CGO_ENABLED=0`` (static binaries, no C toolchain needed).
    """
    go = find_go()
    if go is None:
        raise ServiceError(f"Go is not installed, cannot build {what}")
    timeout = float(os.environ.get(timeout_var, "1200"))
    full_env = {
        "GOMODCACHE": str(go_cache / "mod"),
        "GOCACHE": str(go_cache / "build"),
        "CGO_ENABLED": "0",
        **env,
    }
    t0 = time.monotonic()
    run([go, *args], env=full_env, cwd=cwd, timeout=timeout, log_path=log_path)
    seconds = time.monotonic() - t0
    report.cold = True
    report.provision_seconds += seconds
    if os.environ.get("TXSINK_KEEP_GO_CACHE") != "1":
        shutil.rmtree(go_cache, ignore_errors=True)
    return seconds
