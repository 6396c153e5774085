"""Which process is what: Spark's executor JVM above a task's Python worker, from ``/proc``.

Used by ``kill-executor`` faults (:mod:`txsink.protocol.faults`): the fault must find the JVM that
runs the task, and must never take the driver's JVM for one (local mode runs tasks inside
the driver's JVM).
"""

from __future__ import annotations

import os

__all__ = ["EXECUTOR_MAIN_CLASSES", "find_executor_jvm"]

#: Main classes of Spark's executor JVMs: standalone and local-cluster, YARN, Kubernetes.
EXECUTOR_MAIN_CLASSES = (
    "org.apache.spark.executor.CoarseGrainedExecutorBackend",
    "org.apache.spark.executor.YarnCoarseGrainedExecutorBackend",
    "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
)


def find_executor_jvm(pid: int | None = None) -> int | None:
    """The nearest ancestor of ``pid`` (default: this process) that is a Spark executor JVM.

    A task's Python worker is a child of ``pyspark.daemon`` (or of the JVM itself without
    the daemon), which is a child of the executor JVM. Walks the parent pids in ``/proc``
    and matches the main class on each ancestor's command line (see
    :data:`EXECUTOR_MAIN_CLASSES`); stops at a driver JVM (``SparkSubmit``), so the driver's
    JVM is never returned. ``None`` without ``/proc`` or without an executor ancestor.
    """
    current = os.getpid() if pid is None else pid
    for _ in range(64):  # a loop guard: real chains are 2-4 processes long
        parent = _parent_pid(current)
        if parent is None or parent <= 1:
            return None
        argv = _cmdline(parent)
        if "org.apache.spark.deploy.SparkSubmit" in argv:
            return None
        if any(cls in argv for cls in EXECUTOR_MAIN_CLASSES):
            return parent
        current = parent
    return None


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return _ppid_from_stat(f.read().decode(errors="replace"))
    except OSError:
        return None


def _ppid_from_stat(stat: str) -> int | None:
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; split after the last ")".
    close = stat.rfind(")")
    fields = stat[close + 1 :].split() if close >= 0 else []
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []
