"""Shared plumbing for the local service processes: paths, ports, pid files, state, logging.

Everything a run writes lives under ``integration/.work/`` (git-ignored; PostgreSQL's
cluster, when we are root, under ``/var/lib/txsink-services/<key>/`` with a symlink in
``.work``), and ``down --purge`` of every service removes all of it; everything that is
downloaded or built lives under the user cache (``~/.cache/txsink-services/``) so a second
start on the same machine downloads nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INTEGRATION_DIR = Path(__file__).resolve().parent.parent
WORK_DIR = Path(os.environ.get("TXSINK_SERVICES_WORK", INTEGRATION_DIR / ".work"))
# A second set of servers in a work folder of its own (TXSINK_SERVICES_WORK) keeps its env
# file there too, so it never replaces the checkout's.
ENV_FILE = (
    WORK_DIR / "services.env"
    if "TXSINK_SERVICES_WORK" in os.environ
    else INTEGRATION_DIR / ".services.env"
)
STATE_FILE = WORK_DIR / "state.json"
LOCK_FILE = WORK_DIR / ".lock"
LOG_DIR = WORK_DIR / "logs"
PID_DIR = WORK_DIR / "pids"
LOOPBACK = "127.0.0.1"


def cache_dir() -> Path:
    """Where downloads and builds are kept between runs (survives ``down --purge``)."""
    explicit = os.environ.get("TXSINK_SERVICES_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "txsink-services"


class ServiceError(RuntimeError):
    """A service could not be provisioned or started; the message says what to look at."""


@dataclass
class StartReport:
    """What ``up`` did for one service, so it can print honest cold/warm timings."""

    name: str
    env: dict[str, str]
    seconds: float = 0.0
    provision_seconds: float = 0.0
    cold: bool = False
    already_running: bool = False
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.already_running:
            how = "already running"
        elif self.cold:
            how = f"cold: downloads/builds {self.provision_seconds:.1f}s"
        else:
            how = "warm: from cache"
        extra = f"; {'; '.join(self.notes)}" if self.notes else ""
        return f"{self.seconds:6.1f}s ({how}{extra})"


def log(msg: str) -> None:
    """Progress goes to stderr so stdout stays parseable (the env lines)."""
    print(f"[services] {msg}", file=sys.stderr, flush=True)


_DSN_PASSWORD = re.compile(r"(://[^:/@\s]+:)([^@\s]+)(@)")
_KV_PASSWORD = re.compile(r"(password=)(\S+)", re.IGNORECASE)


def redact(text: str) -> str:
    """Hide passwords in DSNs (URL and key=value forms) before anything is printed or logged."""
    return _KV_PASSWORD.sub(r"\1***", _DSN_PASSWORD.sub(r"\1***\3", text))


def quiet_logger() -> logging.Logger:
    """librdkafka prints every refused connection to stderr; route it to a silent logger."""
    logger = logging.getLogger("txsink.services.rdkafka")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
    return logger


def ensure_dirs() -> None:
    for d in (WORK_DIR, LOG_DIR, PID_DIR):
        d.mkdir(parents=True, exist_ok=True)
        # Other users (postgres) must be able to traverse into the work folder.
        d.chmod(0o755)


@contextlib.contextmanager
def cache_lock(what: str) -> Iterator[None]:
    """Hold the user cache's lock for ``what`` (a build or a download) while it is made.

    The cache is shared by every checkout and run on the machine (two suites at once, a
    developer's terminal beside CI): two cold ``up`` runs must not build into the same
    folders, and one must never delete the Go caches while the other still builds from
    them. The second caller waits here, then finds the finished result and reuses it, so
    every builder re-checks its result once it holds the lock.
    """
    folder = cache_dir() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{what}.lock").open("a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def real_servers_required() -> bool:
    """Under CI (``CI=true``) a real server that cannot start is an error, never a
    silent fallback to a stand-in: a green run must have tested against the real thing."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serialise ``up``/``down`` between concurrent callers (two terminals, xdist workers)."""
    ensure_dirs()
    with LOCK_FILE.open("a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def load_state() -> dict[str, Any]:
    try:
        data = json.loads(STATE_FILE.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def save_state(state: Mapping[str, Any]) -> None:
    ensure_dirs()
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    tmp.replace(STATE_FILE)


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def choose_port(default: int, previous: object, taken: set[int]) -> int:
    """Last run's port if free, else the documented default if free, else any free
    loopback port; never one another work folder on this machine has claimed.

    Last run's first: a server restarted (``down`` then ``up``, or ``up`` after it died)
    keeps its port, so clients, env files and proxies that still point at it stay valid.
    ``up`` prints the port whenever it is not the default.

    "Free" is not enough on a machine several checkouts share: a port only a test binds
    (the Kafka proxy's advertised port) is free in every checkout until that test runs,
    and two cold ``up`` runs at once both find the default free before either binds it.
    So the choice is made under a machine-wide lock and recorded as a claim
    (:func:`claim_ports`) that other work folders respect while the claiming work folder
    exists (``down --purge`` of a service releases its claims).
    """
    with cache_lock("ports"):
        elsewhere = _claimed_elsewhere()
        candidates = [previous] if isinstance(previous, int) else []
        if default not in candidates:
            candidates.append(default)
        for preferred in candidates:
            if preferred not in taken and preferred not in elsewhere and port_is_free(preferred):
                return _take(preferred, taken)
        for _ in range(50):
            port = free_port()
            if port not in taken and port not in elsewhere:
                return _take(port, taken)
    raise ServiceError("no free loopback port found")


def _take(port: int, taken: set[int]) -> int:
    taken.add(port)
    _write_claim(port)
    return port


def _claims_dir() -> Path:
    return cache_dir() / "ports"


def _owner() -> str:
    return str(WORK_DIR.resolve())


def _claimed_elsewhere() -> dict[int, str]:
    """Ports claimed by other work folders that still exist (call under the lock); the
    claims of a work folder that is gone (purged, or its checkout deleted) are removed."""
    out: dict[int, str] = {}
    folder = _claims_dir()
    if not folder.is_dir():
        return out
    for entry in folder.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            owner = json.loads(entry.read_text())["work"]
        except (OSError, ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)
            continue
        if owner == _owner():
            continue
        if Path(owner).is_dir():
            out[int(entry.name)] = owner
        else:
            entry.unlink(missing_ok=True)
    return out


def _write_claim(port: int) -> None:
    folder = _claims_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(port)).write_text(json.dumps({"work": _owner()}))


def claim_ports(ports: set[int]) -> list[str]:
    """Claim ``ports`` for this work folder (a server found running keeps its ports, and
    says so to other checkouts); returns a warning per port another work folder claimed
    first (both use it: restart one set with ``down`` then ``up`` to move it)."""
    warnings: list[str] = []
    with cache_lock("ports"):
        elsewhere = _claimed_elsewhere()
        for port in sorted(ports):
            if port in elsewhere:
                warnings.append(f"port {port} is also claimed by {elsewhere[port]}")
            else:
                _write_claim(port)
    return warnings


def release_ports(ports: set[int]) -> None:
    """Give up this work folder's claims on ``ports`` (its service was purged)."""
    folder = _claims_dir()
    with cache_lock("ports"):
        for port in ports:
            entry = folder / str(port)
            try:
                owner = json.loads(entry.read_text())["work"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if owner == _owner():
                entry.unlink(missing_ok=True)


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_file(name: str) -> Path:
    return PID_DIR / f"{name}.pid"


def read_pid(name: str) -> int | None:
    try:
        return int(pid_file(name).read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def write_pid(name: str, pid: int) -> None:
    ensure_dirs()
    pid_file(name).write_text(f"{pid}\n")


def pid_cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def pid_alive(pid: int, marker: str | None = None) -> bool:
    """True if ``pid`` runs and (when given) its command line contains ``marker``.

    The marker guards against a recycled pid: we only ever signal our own server.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except (OSError, IndexError):
        pass
    return marker is None or marker in pid_cmdline(pid)


def stop_pid(
    pid: int, marker: str | None, sig: int = signal.SIGTERM, timeout: float = 30.0
) -> bool:
    """Signal our own process and wait for it to exit; SIGKILL after ``timeout``."""
    if not pid_alive(pid, marker):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid, marker):
            return True
        time.sleep(0.1)
    log(f"pid {pid} did not exit after {timeout:.0f}s; sending SIGKILL")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        if not pid_alive(pid, marker):
            break
        time.sleep(0.1)
    return True


def spawn(
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start a server detached from our session so it outlives ``up`` and the test run."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with log_path.open("ab") as out:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=str(cwd) if cwd else None,
            start_new_session=True,
            close_fds=True,
        )


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    log_path: Path | None = None,
) -> str:
    """Run a helper command to completion; on failure raise with the tail of its output."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        proc = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=full_env,
            cwd=str(cwd) if cwd else None,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"{argv[0]} timed out after {timeout}s") from exc
    output = (proc.stdout + proc.stderr).decode(errors="replace")
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a") as fh:
            fh.write(f"$ {' '.join(argv)}\n{output}\n")
    if proc.returncode != 0:
        raise ServiceError(
            f"{' '.join(argv[:3])} ... failed with exit {proc.returncode}:\n{tail_text(output)}"
        )
    return output


def tail_text(text: str, lines: int = 25) -> str:
    return redact("\n".join(text.rstrip().splitlines()[-lines:]))


def tail_file(path: Path, lines: int = 25) -> str:
    try:
        return tail_text(path.read_text(errors="replace"), lines)
    except FileNotFoundError:
        return f"(no log at {path})"


def wait_until(what: str, check: Any, timeout: float, *, alive: Any = None) -> None:
    """Poll ``check()`` until true; fail early when ``alive()`` says the process died."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    while time.monotonic() < deadline:
        if check():
            return
        if alive is not None and not alive():
            raise ServiceError(f"{what}: the process exited during start-up")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
    raise ServiceError(f"{what}: not ready after {timeout:.0f}s")


def is_root() -> bool:
    return os.geteuid() == 0


def apt_install(*packages: str) -> None:
    """Install Debian packages (root only); ``apt-get update`` first on a fresh machine."""
    if not is_root():
        raise ServiceError(
            f"{' '.join(packages)} missing and not running as root: install it "
            f"(apt-get install {' '.join(packages)}) or point TXSINK_* env vars at your servers"
        )
    if shutil.which("apt-get") is None:
        raise ServiceError(f"{' '.join(packages)} missing and apt-get not available")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    log(f"apt-get install {' '.join(packages)}")
    run(["apt-get", "update", "-qq"], env=env, timeout=600, log_path=LOG_DIR / "apt.log")
    run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        env=env,
        timeout=1200,
        log_path=LOG_DIR / "apt.log",
    )
