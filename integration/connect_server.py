"""A real local Spark Connect server for the tests: PySpark's own ``SparkConnectServer``.

Started with the pip package's ``bin/spark-submit`` in the foreground (what
``sbin/start-connect-server.sh --wait`` runs, without its pid files and log folder), in its
own process group, on 127.0.0.1 and a free port::

    spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer \\
        --master local[2,2] --conf spark.connect.grpc.binding.port=P ...

Its Python processes (the ``foreachBatch`` process of each query, the tasks' workers) are
its children and run this interpreter (``PYSPARK_PYTHON``); the JVM maps Spark's classes
from txsink's CDS archive when one was built (:mod:`txsink.spark.jvmcds`). :meth:`kill` SIGKILLs
the whole group (a crash), :meth:`restart` starts it again on the same port.

A Connect client cannot share a Python process with a classic SparkSession (PySpark raises
``SESSION_ALREADY_EXIST``, and a remote session sets ``SPARK_CONNECT_MODE_ENABLED`` for the
whole process), and the suite's processes hold the classic one of ``conftest.py``: client
code runs in a child process, :func:`client_cmd` (``python -m txsink.runner FILE.py:FUNC``
with ``remote=`` among its keyword arguments).

From a shell::

    .venv/bin/python integration/connect_server.py     # start one, print its URL, wait
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ConnectServer", "ConnectServerError", "client_cmd", "client_env"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_READY = "Spark Connect server started at"


class ConnectServerError(RuntimeError):
    """The server did not come up; the message names its log."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_CENTRAL = "https://repo1.maven.org/maven2"


def on_central(coordinate: str) -> str:
    """``group:artifact:version`` as Maven Central has it: that version if its jar is there,
    else the newest release of the same line below it (Central lags behind PyPI: PySpark
    3.5.9's ``spark-connect_2.12`` is not there, 3.5.7's is, and a server of the same line
    runs on it). The coordinate as given when Central cannot be read (Spark says why)."""
    import re
    import urllib.request

    group, artifact, version = coordinate.split(":")
    base = f"{_CENTRAL}/{group.replace('.', '/')}/{artifact}"
    try:
        with urllib.request.urlopen(f"{base}/maven-metadata.xml", timeout=30) as response:
            listed = re.findall(r"<version>([^<]+)</version>", response.read().decode())
    except OSError:
        return coordinate
    line = version.rsplit(".", 1)[0]

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))

    same_line = [v for v in listed if re.fullmatch(rf"{re.escape(line)}\.\d+", v)]
    below = sorted((v for v in same_line if key(v) <= key(version)), key=key)
    return f"{group}:{artifact}:{below[-1]}" if below and version not in listed else coordinate


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class ConnectServer:
    """One local Spark Connect server (``local[2,2]``: two cores, a failed task retried
    once, as the classic test session)."""

    workdir: Path
    port: int = field(default_factory=_free_port)
    master: str = "local[2,2]"
    #: Added to the server's environment (its Python workers inherit it): a fault plan
    #: (``TXSINK_FAULT``) aimed at the steps that run in the server, say.
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    start_seconds: float = 0.0

    @property
    def url(self) -> str:
        """The client's address: ``SparkSession.builder.remote(server.url)``."""
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"connect-server-{self.starts}.log"

    @classmethod
    def start_new(
        cls, workdir: Path, *, timeout: float = 180.0, env: dict[str, str] | None = None
    ) -> ConnectServer:
        server = cls(Path(workdir), extra_env=dict(env or {}))
        server.start(timeout=timeout)
        return server

    def command(self) -> list[str]:
        from txsink.spark.jvmcds import java_options

        java = " ".join(filter(None, ["-XX:TieredStopAtLevel=1 -XX:+UseSerialGC", java_options()]))
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.memory": "1g",
            "spark.driver.extraJavaOptions": java,
        }
        from txsink.spark.versions import connect_server_packages

        cmd = [str(_spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        cmd += ["--name", "txsink-connect-tests", "--master", self.master]
        # PySpark 3.5's pip package has no spark-connect jar: Spark fetches it (Maven Central,
        # once, into ~/.ivy2); 4.x ships it.
        packages = [on_central(p) for p in connect_server_packages()]
        if packages:
            cmd += ["--packages", ",".join(packages)]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            SPARK_HOME=str(_spark_home()),
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            **self.extra_env,
        )

    def start(self, *, timeout: float = 180.0) -> None:
        """Start the server and wait until it accepts clients."""
        if self.proc is not None and self.proc.poll() is None:
            raise ConnectServerError(f"the Connect server on port {self.port} already runs")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        began = time.monotonic()
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                self.command(),
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: kill() takes its Python children too
            )
        deadline = began + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConnectServerError(
                    f"the Connect server exited with code {self.proc.returncode} while "
                    f"starting: see {self.log_path}"
                )
            if _READY in self.log_path.read_text(errors="replace") and self._accepts():
                self.start_seconds = time.monotonic() - began
                return
            time.sleep(0.2)
        self.kill()
        raise ConnectServerError(f"no Connect server after {timeout:.0f} s: see {self.log_path}")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        """The server's processes now: the JVM and its Python children (its group)."""
        if self.proc is None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if int(fields[2]) == self.proc.pid:  # its process group
                    found.append(int(entry.name))
        return found

    def kill(self) -> None:
        """SIGKILL the server and every process of its group: a crash of the Spark driver."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM the group (the JVM stops its queries and Python workers), SIGKILL after
        15 s."""
        if self.proc is None or self.proc.poll() is not None:
            self._reap()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(15)
        self._reap()

    def _reap(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # leftovers of the group, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(15)

    def restart(self, *, timeout: float = 180.0) -> None:
        """Kill (if it runs) and start again on the same port."""
        self.kill()
        self.start(timeout=timeout)


def client_env(server: ConnectServer) -> dict[str, str]:
    """The environment of a client child: this interpreter's, without a classic session's
    settings that would make PySpark start a local JVM."""
    env = dict(os.environ)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(Path(__file__).resolve().parent), env.get("PYTHONPATH", "")] if p
    )
    return env


def client_cmd(server: ConnectServer, func: str, **kwargs: Any) -> list[str]:
    """``python -m txsink.runner FUNC JSON``: ``FUNC`` (``FILE.py:NAME`` or
    ``module:NAME``) called with ``remote=server.url`` and ``kwargs`` in a child process
    (run it with :func:`txsink.runner.run_until_done` to restart it after crashes)."""
    args = json.dumps({"remote": server.url, **kwargs})
    return [sys.executable, "-m", "txsink.runner", func, args]


if __name__ == "__main__":
    work = Path(__file__).resolve().parent / ".work" / "connect"
    running = ConnectServer.start_new(work)
    print(f"{running.url} (started in {running.start_seconds:.1f} s; log {running.log_path})")
    try:
        while running.proc is not None and running.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        running.stop()
