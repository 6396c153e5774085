"""CPU seconds by role, read from ``/proc``: what each part of a run cost, per process and,
where it matters, per thread.

On a shared, CPU-bound machine the wall clock of a run moves with whatever else runs; the
CPU a writer's processes used does not (much). So every benchmark reports CPU-seconds per
million records by role next to its rates, from one meter (:class:`CpuMeter`):

``driver``           the benchmark's own Python process (the Spark driver's Python side)
``jvm``              Spark's JVM (driver and executors of ``local[n]``), a child ``java``
                     of the driver; ``jvm_jit`` and ``jvm_gc`` are its JIT compiler and
                     garbage collector threads (live threads, by name)
``workers``          Spark's Python workers (the daemon and its forks, under the JVM);
                     ``workers_main`` their main threads (the task's Python code),
                     ``workers_threads`` their other threads (librdkafka's ``rdk:*``,
                     Arrow's pool, psycopg's none), exited threads included
``driver_workers``   Python workers the JVM starts for the driver's own calls, not for tasks:
                     a Python Data Source's planning and commit, data source lookup,
                     UDTF analysis (their daemon runs a ``pyspark.sql.worker.*`` module;
                     task workers run ``pyspark.worker``). ``foreachBatch`` runs its code
                     in ``driver`` instead, so a comparison of the two needs this apart
``spark``            driver + jvm + workers + driver_workers
``<server>``         each server's process tree (Postgres' postmaster and backends, the
                     Kafka broker, MinIO), named by the caller
``others``           the rest of the machine's busy time (other jobs: noise, not cost)

Exited processes: a worker that exits is reaped into its parent's ``cutime``, so the role
totals stay whole; its main/other-thread split is lost (then ``workers`` exceeds
``workers_main + workers_threads``; the difference is ``workers_exited``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROC = Path("/proc")

#: JVM thread names (``comm``, at most 15 characters) by what they do.
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
GC_THREADS = ("GC Thread", "G1 ", "VM Thread", "GC ")


@dataclass(frozen=True)
class ProcStat:
    """The fields we use of one ``/proc/<pid>/stat`` (or ``task/<tid>/stat``) line; times
    in clock ticks. ``own`` is the process's (or thread's) own time, ``total`` adds its
    reaped children's."""

    pid: int
    comm: str
    ppid: int
    utime: int
    stime: int
    cutime: int
    cstime: int

    @classmethod
    def parse(cls, line: str) -> ProcStat:
        """Parse a stat line. ``comm`` is in parentheses and may hold spaces and
        parentheses itself, so the fields after it are found from the *last* ``)``."""
        open_, close = line.index("("), line.rindex(")")
        rest = line[close + 2 :].split()
        # rest[0] = state, [1] = ppid, [11..14] = utime, stime, cutime, cstime
        return cls(
            int(line[:open_]),
            line[open_ + 1 : close],
            int(rest[1]),
            *(int(x) for x in rest[11:15]),
        )

    @property
    def own(self) -> int:
        return self.utime + self.stime

    @property
    def total(self) -> int:
        return self.own + self.cutime + self.cstime


def _read_stat(path: Path) -> ProcStat | None:
    try:
        return ProcStat.parse(path.read_text())
    except (OSError, ValueError, IndexError):
        return None  # gone between listing and reading, or not ours to read


def read_processes(proc: Path = PROC) -> dict[int, ProcStat]:
    """Every process's stat line, by pid."""
    out: dict[int, ProcStat] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = _read_stat(entry / "stat")
            if stat is not None:
                out[stat.pid] = stat
    return out


def read_threads(pid: int, proc: Path = PROC) -> dict[int, ProcStat]:
    """The live threads of ``pid``, by thread id (the main thread's id is ``pid``)."""
    out: dict[int, ProcStat] = {}
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return out
    for entry in tasks:
        stat = _read_stat(entry / "stat")
        if stat is not None:
            out[stat.pid] = stat
    return out


def machine_busy(proc: Path = PROC) -> float:
    """CPU seconds all processes used since boot (user, nice, system, irq, softirq, steal)."""
    first = (proc / "stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def tree(table: Mapping[int, ProcStat], root: int) -> list[int]:
    """``root`` and its descendants that are in ``table``, parents before children."""
    children: dict[int, list[int]] = {}
    for stat in table.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        if pid in table:
            out.append(pid)
            todo.extend(sorted(children.get(pid, [])))
    return out


#: In the command line of a Python worker (or its daemon) the JVM starts for a driver-side
#: call: Spark's driver-side worker modules (``pyspark.sql.worker.plan_data_source_read``,
#: ``.python_streaming_sink_runner``, ``.commit_data_source_write``, ...).
DRIVER_WORKER_MODULE = "pyspark.sql.worker."


def read_cmdline(pid: int, proc: Path = PROC) -> str:
    """The process's command line, arguments joined by spaces ("" if gone or unreadable)."""
    try:
        return (
            (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def driver_roles(
    table: Mapping[int, ProcStat], driver: int, cmdlines: Mapping[int, str] | None = None
) -> dict[int, str]:
    """The role of each process in the driver's tree: the driver itself and what it starts
    that is not Java (``driver``), a ``java`` process (``jvm``), and anything under the JVM
    that is not Java: ``driver_workers`` when the JVM's child runs a driver-side worker
    module (``cmdlines``, by pid, of the JVM's children; a forked worker inherits its
    daemon's role), else ``workers`` (the Python daemon and the task workers it forks)."""
    roles: dict[int, str] = {}
    for pid in tree(table, driver):
        stat = table[pid]
        parent = roles.get(stat.ppid, "driver")
        if pid == driver:
            roles[pid] = "driver"
        elif stat.comm.startswith("java"):
            roles[pid] = "jvm"
        elif parent == "jvm":
            is_driver_side = DRIVER_WORKER_MODULE in (cmdlines or {}).get(pid, "")
            roles[pid] = "driver_workers" if is_driver_side else "workers"
        else:
            roles[pid] = parent  # a forked worker, or what the driver itself ran
    return roles


def jvm_children_cmdlines(
    table: Mapping[int, ProcStat], driver: int, proc: Path = PROC
) -> dict[int, str]:
    """The command lines of the non-Java children of the driver's JVMs (what
    :func:`driver_roles` needs to tell driver-side workers from task workers)."""
    pids = tree(table, driver)
    jvms = {p for p in pids if table[p].comm.startswith("java")}
    return {
        p: read_cmdline(p, proc)
        for p in pids
        if table[p].ppid in jvms and not table[p].comm.startswith("java")
    }


#: A snapshot: role -> seconds, plus per-thread tick counters keyed by (role, pid, tid).
Snapshot = dict[str, float]


def _thread_kind(role: str, pid: int, thread: ProcStat) -> str | None:
    if role == "workers":
        return "workers_main" if thread.pid == pid else None
    if role == "jvm":
        if thread.comm.startswith(JIT_THREADS):
            return "jvm_jit"
        if thread.comm.startswith(GC_THREADS):
            return "jvm_gc"
    return None


class CpuMeter:
    """CPU seconds by role between two snapshots (see the module's docstring).

    ``roots`` names process trees: the key ``spark`` is the benchmark's driver (split into
    ``driver``, ``jvm``, ``workers`` and their threads); any other key is a server, counted
    as its whole tree (a server's tree also holds other clients' backends, so it is an upper
    bound). Take a snapshot before and after a run; :meth:`delta` gives the seconds.
    """

    def __init__(self, roots: Mapping[str, int], proc: Path = PROC) -> None:
        self.roots = dict(roots)
        self.proc = proc

    def snapshot(self) -> Snapshot:
        """Role totals in seconds, and per-thread counters (keys ``thread:...``) in ticks."""
        if not (self.proc / "stat").exists():
            return {}
        table = read_processes(self.proc)
        snap: Snapshot = {"machine": machine_busy(self.proc)}
        for name, root in self.roots.items():
            if name != "spark":
                snap[name] = sum(table[p].total for p in tree(table, root)) / TICK
                continue
            roles = driver_roles(table, root, jvm_children_cmdlines(table, root, self.proc))
            for role in ("driver", "jvm", "workers", "driver_workers"):
                snap[role] = 0.0
            for pid, role in roles.items():
                snap[role] += table[pid].total / TICK
                if role == "workers":
                    snap[f"thread:workers_own:{pid}:0"] = table[pid].own
                if role in ("workers", "jvm"):
                    for tid, thread in read_threads(pid, self.proc).items():
                        kind = _thread_kind(role, pid, thread)
                        if kind is not None:
                            snap[f"thread:{kind}:{pid}:{tid}"] = thread.own
        return snap

    @staticmethod
    def delta(before: Snapshot, after: Snapshot) -> dict[str, float]:
        """Seconds per role between the snapshots, plus ``others``: the machine's busy time
        not in any root. Threads (and the workers' own time) are counted by id over the ids
        alive at the second snapshot: one that started in between counts whole; one that
        ended in between is left out of the parts (its time is in its role's total)."""
        if not before or not after:
            return {}
        totals = [k for k in after if k != "machine" and not k.startswith("thread:")]
        out = {k: after[k] - before.get(k, 0.0) for k in totals}
        threads: dict[str, float] = {}
        for key, ticks in after.items():
            if key.startswith("thread:"):
                kind = key.split(":")[1]
                threads[kind] = threads.get(kind, 0.0) + (ticks - before.get(key, 0.0)) / TICK
        if "workers" in out:
            own = threads.get("workers_own", 0.0)
            main = threads.get("workers_main", 0.0)
            out["workers_main"] = main
            out["workers_threads"] = max(0.0, own - main)
            out["workers_exited"] = max(0.0, out["workers"] - own)
            out["jvm_jit"] = threads.get("jvm_jit", 0.0)
            out["jvm_gc"] = threads.get("jvm_gc", 0.0)
            out["spark"] = (
                out["driver"] + out["jvm"] + out["workers"] + out.get("driver_workers", 0.0)
            )
        measured = sum(v for k, v in out.items() if k in _TOP_LEVEL or k not in _PARTS)
        machine = after["machine"] - before["machine"]
        out["others"] = max(0.0, machine - measured)
        return out


#: Roles that are parts of another role (not added again for ``others``).
_PARTS = frozenset(
    {"spark", "workers_main", "workers_threads", "workers_exited", "jvm_jit", "jvm_gc"}
)
_TOP_LEVEL = frozenset({"driver", "jvm", "workers", "driver_workers"})


def server_pids(names: Iterable[str]) -> dict[str, int]:
    """The pids of integration/services' local servers among ``names`` (``postgres``,
    ``kafka``, ``s3``) that run here: ``{name: pid}``; a server elsewhere (a DSN to another
    host, testcontainers) is not measured, and its CPU columns say so."""
    from _services.common import read_pid

    out: dict[str, int] = {}
    for name in names:
        pid = read_pid(name)
        if pid is None:
            continue
        try:
            os.kill(pid, 0)
        except OSError:
            continue
        out[name] = pid
    return out
