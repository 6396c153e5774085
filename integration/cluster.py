"""A local Spark standalone cluster from the pip-installed PySpark: one master, two workers.

Three separate JVM daemons on 127.0.0.1, each started with PySpark's own ``bin/spark-class``
(the pip package ships no ``sbin/start-master.sh`` / ``start-worker.sh``; ``spark-class``
builds the same ``java`` command line and ``exec``\\s it, so the daemon's pid is the JVM's)::

    spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port P --webui-port W
    spark-class org.apache.spark.deploy.worker.Worker spark://127.0.0.1:P --host 127.0.0.1 \\
        --cores 1 --memory 1g --work-dir .work/cluster/worker-N --port 0 --webui-port WN

Each daemon runs in its own process group; a worker starts its executor JVMs as its children
(same group), so stopping a worker's group also ends its executors. Files live under
``integration/.work/cluster/`` (``logs/``, ``worker-N/`` with the executors' stdout/stderr).

From a shell::

    .venv/bin/python integration/cluster.py up      # start, print the master URL and timings
    .venv/bin/python integration/cluster.py down    # stop the cluster started by ``up``
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Cluster", "ClusterError", "driver_conf", "running_cluster", "spark_home"]

WORK = Path(__file__).resolve().parent / ".work" / "cluster"


class ClusterError(RuntimeError):
    """The cluster did not come up; the message names the log to read."""


def spark_home() -> Path:
    """The pip-installed PySpark's folder: a complete ``SPARK_HOME`` (``bin``, ``jars``)."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists() or not (home / "jars").is_dir():
        raise ClusterError(f"{home} has no bin/spark-class or jars/: not a usable SPARK_HOME")
    return home


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """A started standalone cluster: addresses, processes and how long the start took."""

    master_url: str
    webui_url: str
    workdir: Path
    workers: int
    cores_per_worker: int
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    start_seconds: float = 0.0

    def state(self) -> dict[str, object]:
        """The master's ``/json`` page: workers, their state, running applications."""
        with urllib.request.urlopen(self.webui_url + "/json", timeout=5) as resp:
            data: dict[str, object] = json.load(resp)
        return data

    def alive_workers(self) -> int:
        workers = self.state().get("workers", [])
        return (
            sum(1 for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE")
            if isinstance(workers, list)
            else 0
        )

    def executor_pids(self) -> list[int]:
        """Pids of the executor JVMs running now (children of the worker daemons)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"CoarseGrainedExecutorBackend" in cmdline and str(self.workdir).encode() in cmdline:
                pids.append(int(proc.name))
        return pids

    def stop(self) -> None:
        """SIGTERM every daemon's process group (executors included), SIGKILL after 10 s."""
        for proc in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.processes.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        # Executors run in their worker's group; make sure none outlived it.
        for pid in self.executor_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.processes.clear()


def driver_conf(cluster: Cluster) -> dict[str, str]:
    """Spark settings for a driver on this cluster: two executors of one core and 1 GiB.

    ``spark.task.maxFailures=2``: a task killed once is retried, killed twice fails the job,
    the way ``local[2,2]`` behaves in the local tests.
    """
    return {
        "spark.executor.memory": "1g",
        "spark.executor.cores": "1",
        "spark.cores.max": str(cluster.workers * cluster.cores_per_worker),
        "spark.task.maxFailures": "2",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    }


def submit_args(cluster: Cluster) -> str:
    """``PYSPARK_SUBMIT_ARGS`` carrying :func:`driver_conf` to a child's SparkSession."""
    # PySpark splits the variable with shlex.split, so quoted values keep their spaces.
    confs = " ".join(f"--conf {shlex.quote(f'{k}={v}')}" for k, v in driver_conf(cluster).items())
    return f"{confs} pyspark-shell"


def _spawn(name: str, args: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - the daemon owns it
    try:
        return subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        log.close()


def start_cluster(
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    *,
    workdir: Path = WORK,
    timeout: float = 90.0,
    worker_hosts: Sequence[str] = (),
) -> Cluster:
    """Start a master and ``workers`` workers; return once every worker is ALIVE on the master.

    ``worker_hosts``: worker N's address (default ``127.0.0.1``). Distinct loopback addresses
    (``127.0.0.2``, ...) make the workers distinct hosts to Spark's scheduler, which never
    places a speculative copy of a task on a host that already runs an attempt of it.
    """
    began = time.monotonic()
    home = spark_home()
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        SPARK_HOME=str(home),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        # The daemons' own JVM flags: a faster start, a small heap.
        SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        SPARK_CONF_DIR=str(workdir / "conf"),
        PYSPARK_PYTHON=sys.executable,
    )
    (workdir / "conf").mkdir(exist_ok=True)  # empty: no site spark-defaults.conf leaks in
    port, webui = _free_port(), _free_port()
    cluster = Cluster(
        master_url=f"spark://127.0.0.1:{port}",
        webui_url=f"http://127.0.0.1:{webui}",
        workdir=workdir,
        workers=workers,
        cores_per_worker=cores,
    )
    try:
        cluster.processes["master"] = _spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(webui),
            ],
            env,
            logs,
        )
        for n in range(workers):
            wdir = workdir / f"worker-{n}"
            wdir.mkdir(exist_ok=True)
            host = worker_hosts[n] if n < len(worker_hosts) else "127.0.0.1"
            cluster.processes[f"worker-{n}"] = _spawn(
                f"worker-{n}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    cluster.master_url,
                    "--host",
                    host,
                    "--port",
                    "0",
                    "--webui-port",
                    str(_free_port()),
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--work-dir",
                    str(wdir),
                ],
                dict(env, SPARK_LOCAL_IP=host),
                logs,
            )
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in cluster.processes.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"spark {name} exited with code {proc.returncode}; see {logs}/{name}.log"
                    )
            with contextlib.suppress(OSError, ValueError):
                if cluster.alive_workers() >= workers:
                    break
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{workers} workers not registered with {cluster.master_url} after "
                    f"{timeout:.0f}s; see {logs}/"
                )
            time.sleep(0.5)
    except BaseException:
        cluster.stop()
        raise
    cluster.start_seconds = time.monotonic() - began
    return cluster


@contextlib.contextmanager
def running_cluster(**options: object) -> Iterator[Cluster]:
    """:func:`start_cluster`, stopped on exit."""
    cluster = start_cluster(**options)  # type: ignore[arg-type]
    try:
        yield cluster
    finally:
        cluster.stop()


def _main(argv: list[str]) -> int:
    state = WORK / "state.json"
    if argv[:1] == ["up"]:
        cluster = start_cluster()
        state.write_text(
            json.dumps(
                {
                    "master_url": cluster.master_url,
                    "webui_url": cluster.webui_url,
                    "pgids": [p.pid for p in cluster.processes.values()],
                }
            )
        )
        print(
            f"spark master {cluster.master_url} (web UI {cluster.webui_url}), "
            f"{cluster.workers} workers, started in {cluster.start_seconds:.1f}s"
        )
        print(f"export PYSPARK_SUBMIT_ARGS='{submit_args(cluster)}'")
        return 0
    if argv[:1] == ["down"]:
        if not state.exists():
            print("no cluster state: nothing to stop")
            return 0
        for pgid in json.loads(state.read_text())["pgids"]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
        state.unlink()
        print("stopped")
        return 0
    print("usage: cluster.py up|down", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
