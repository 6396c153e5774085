"""The Data Source path's driver side: recovery before the tasks, the decision in ``commit``.

Spark runs a Python Data Source's driver-side calls in Python workers the JVM starts on the
driver, never in the user's process, and each in a fresh writer object: the planning of a
batch (``streamWriter()`` / ``writer()``, before its tasks) in one, ``commit`` / ``abort``
(after them) in another. Nothing is shared between them or with the user's process but the
options, the pickled writer (static writes) and the txsink log, so each step opens the log.

1. :func:`plan_tasks` (planning, before every batch's tasks): bind the log, check the sink
   against the batch's schema, run recovery (the coordinator's, commit what is decided and
   abort what no decision names), and choose the round the tasks prepare under: one above
   every round the log or recovery has seen for the epochs not yet committed.
2. The tasks write and prepare (:mod:`txsink.datasource`), under that round.
3. :func:`commit_epoch` (Spark's ``commit``): the coordinator's steps 2 to 5 over the tasks'
   acks (:meth:`~txsink.Coordinator.run_epoch` with ``tasks_round``): skip a committed
   epoch (a replay), claim the round, decide, commit, abort unused attempts.
4. :func:`abort_epoch` (Spark's ``abort``, after a failed task or a failed ``commit``):
   void the round, then abort its transactions; a decided epoch is left alone (the next
   planning's recovery commits it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txsink.coordinator import Coordinator
from txsink.errors import EpochAbortedError
from txsink.handles import load_handle
from txsink.observe.logs import get_logger
from txsink.ops import precheck as _precheck
from txsink.protocol.commit import abort_one
from txsink.protocol.faults import CrashPoint, FaultPlan
from txsink.protocol.recovery import Recovery
from txsink.protocol.task import Ack
from txsink.spark.checks import check_sinks

if TYPE_CHECKING:
    import pyarrow as pa

    from txsink.datasource.options import DsConfig

__all__ = ["TaskSetup", "abort_epoch", "checkpoint_query_id", "commit_epoch", "plan_tasks"]


#: The sink checks done in this process (a planning worker lives across a query's batches).
_CHECKED: set[tuple[str, str, str, str]] = set()


@dataclass(frozen=True)
class TaskSetup:
    """What planning tells the tasks: the app (``None``: the query id they see), the round,
    and the last committed epoch (a task of an epoch up to it writes nothing: a replay)."""

    app_id: str | None
    round: int
    committed_through: int | None
    epoch: int | None = None  # static writes: the epoch chosen at planning


def coordinator(config: DsConfig) -> Coordinator:
    """The one-sink coordinator of a Data Source write (cheap: opens nothing yet); its
    driver lease is the Spark driver's, as the planning's is (:func:`plan_tasks`)."""
    coord = Coordinator(
        [config.sink],
        log=config.log,
        app_id=config.app_id,
        retain_epochs=config.retain_epochs,
        faults=driver_faults(),
        lease_s=config.lease_s,
    )
    coord._lease_as(driver_pid())
    return coord


def driver_pid() -> int | None:
    """The Spark driver's process, seen from a Python worker its JVM started: the parent of
    the nearest ``java`` ancestor when that JVM was launched by a Python driver (PySpark sets
    ``_PYSPARK_DRIVER_CONN_INFO_PATH`` in the JVM's environment), else the JVM itself (a Spark
    Connect server: the driver is the server, the user's client is elsewhere). ``None`` where
    that cannot be read (no ``/proc``): a ``kill-driver`` fault then kills the worker itself."""
    pid = os.getppid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                stat = f.read()
        except OSError:
            return None
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        if name == "java":
            return parent if parent > 1 and _launched_by_python(pid) else pid
        pid = parent
    return None


def _launched_by_python(jvm: int) -> bool:
    try:
        with open(f"/proc/{jvm}/environ", "rb") as f:
            return b"\0_PYSPARK_DRIVER_CONN_INFO_PATH=" in b"\0" + f.read()
    except OSError:
        return True  # unreadable: keep the classic answer


@dataclass(frozen=True)
class _DriverFaults(FaultPlan):
    """``TXSINK_FAULT`` for the Data Source's driver-side steps: ``kill-driver`` kills the
    user's driver process, not the Python worker these steps run in."""

    driver: int | None = None

    def fire(
        self,
        point: CrashPoint,
        *,
        epoch: int,
        partition: int | None = None,
        driver_pid: int | None = None,
        driver_host: str | None = None,
    ) -> None:
        pid = driver_pid or self.driver
        super().fire(
            point, epoch=epoch, partition=partition, driver_pid=pid, driver_host=driver_host
        )


def driver_faults() -> FaultPlan | None:
    """The fault plan of ``TXSINK_FAULT``, aimed at the user's driver process."""
    plan = FaultPlan.from_env()
    return None if plan is None else _DriverFaults(plan.faults, plan.state_dir, driver_pid())


def checkpoint_query_id(checkpoint: str | None) -> str | None:
    """The streaming query's id, from a local checkpoint's ``metadata`` (Spark writes it when
    the query starts); ``None`` for a checkpoint this process cannot read."""
    if not checkpoint:
        return None
    path = checkpoint.removeprefix("file://") if checkpoint.startswith("file:/") else checkpoint
    if "://" in path:
        return None
    try:
        with open(os.path.join(path, "metadata"), encoding="utf-8") as f:
            doc = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    found = doc.get("id") if isinstance(doc, dict) else None
    return str(found) if found else None


def plan_tasks(
    config: DsConfig, schema: pa.Schema, *, streaming: bool
) -> tuple[Coordinator, TaskSetup]:
    """Step 1: recovery and the round, before a batch's tasks (see the module doc)."""
    coord = coordinator(config)
    log = coord.log
    app_id = config.app_id or (checkpoint_query_id(config.checkpoint) if streaming else None)
    if app_id is None:
        meta = log.meta()
        app_id = None if meta is None else str(meta["app_id"])
    if app_id is None and not streaming:
        raise _precheck.empty_log_error(log.location)
    if app_id is not None:
        log.bind_app(app_id)  # the log's own checks come before the sink's
        checked = (log.location, config.sink.uid, app_id, schema.to_string())
        if checked not in _CHECKED:  # once per query and schema while this worker lives
            # No partitioning (options), and no schema change: its tasks are not this
            # process's, so nothing planned here could reach them (docs/datasource.md).
            check_sinks(coord.sinks, schema, app_id, None, log=log, path="format('txsink')")
            _CHECKED.add(checked)
        # The Spark driver's lease, renewed at each planning (which may run in another
        # Python worker each batch): a second live driver refuses here, before recovery.
        coord._keeper().hold()
        recovery = _recovery(coord)
        recovery.execute(recovery.plan(app_id))
    last = log.last_committed()
    epoch = None
    if not streaming:
        epoch = config.epoch if config.epoch is not None else (0 if last is None else last + 1)
    seen = [-1]
    for e in log.epochs() if epoch is None else [epoch]:
        if last is not None and e <= last and epoch is None:
            continue
        state = log.state(e)
        seen += [*state.rounds, *state.voided]
        if state.decision is not None:
            seen.append(state.decision.round)
    return coord, TaskSetup(app_id, max(seen) + 1, last, epoch)


def _acks(messages: Sequence[Any]) -> tuple[str | None, list[Ack]]:
    """The tasks' acks and the app they wrote as; ``None`` messages are failed tasks."""
    acks: list[Ack] = []
    apps = set()
    for message in messages:
        if message is None:
            continue
        acks.extend(message.acks)
        if message.app_id is not None:
            apps.add(message.app_id)
    if len(apps) > 1:
        raise EpochAbortedError(f"the tasks wrote as different apps {sorted(apps)}")
    return (apps.pop() if apps else None), acks


def commit_epoch(
    config: DsConfig,
    epoch: int,
    round_: int | None,
    messages: Sequence[Any],
    *,
    static: bool = False,
) -> None:
    """Steps 2 to 5 over the tasks' acks (Spark's ``commit``). ``round_`` is ``None`` for a
    batch without tasks: then nothing is in flight and the coordinator runs as usual.
    ``static``: a committed epoch is skipped even below the log's last one (a re-run)."""
    app_id, acks = _acks(messages)
    coord = coordinator(config)
    if app_id is None:  # no task wrote: nothing of this epoch exists anywhere
        app_id = config.app_id or _log_app(coord)
        if app_id is None:
            return
    if static and coord.log.committed(epoch) is not None:
        # A static write re-run with its explicit epoch: done before, whichever epochs
        # came after it (the streaming guard against a reset checkpoint does not apply).
        _abort_acks(config, epoch, acks, f"epoch {epoch} is committed already (a re-run)")
        get_logger(__name__, uid=config.sink.uid, epoch=epoch).info("already committed: skipped")
        return
    result = coord.run_epoch(
        epoch,
        lambda _plan: acks,
        app_id=app_id,
        tasks_round=round_,
        tasks_seconds=_tasks_seconds(messages),
    )
    if result.status == "skipped":  # a replay: whatever its tasks prepared is a duplicate
        _abort_acks(config, epoch, acks, f"epoch {epoch} is committed already (a replay)")


def _tasks_seconds(messages: Sequence[Any]) -> float | None:
    """The pre-commit's duration as the tasks timed it: first start to last end (wall clock,
    so across hosts it is as good as their clocks agree); ``None`` if a task did not say."""
    starts: list[float] = []
    ends: list[float] = []
    for message in messages:
        started, finished = getattr(message, "started", None), getattr(message, "finished", None)
        if started is None or finished is None:
            return None
        starts.append(float(started))
        ends.append(float(finished))
    return max(0.0, max(ends) - min(starts)) if starts else None


def abort_epoch(config: DsConfig, epoch: int, round_: int, messages: Sequence[Any]) -> None:
    """Void the tasks' round, then abort what they prepared; a decided epoch stands."""
    app_id, acks = _acks(messages)
    coord = coordinator(config)
    if coord.log.meta() is None:
        return  # nothing was decided; the next planning's recovery aborts what is left
    if coord.log.void(epoch, round_, "Spark aborted the batch") is not None:
        return  # decided: recovery commits it at the next planning
    _abort_acks(config, epoch, acks, f"Spark aborted epoch {epoch}")
    if app_id is not None:  # failed attempts' transactions, listed in the target
        _recovery(coord).abort_attempts(app_id, epoch, round_=round_, best_effort=True)


def _abort_acks(config: DsConfig, epoch: int, acks: Sequence[Ack], why: str) -> None:
    """Abort the transactions the tasks reported (best effort: recovery retries)."""
    sink = config.sink
    logger = get_logger(__name__, uid=sink.uid, epoch=epoch)
    for ack in acks:
        if ack.handle is not None:
            handle = load_handle(ack.handle, sink_uid=sink.uid)
            abort_one(sink, handle, why, log=logger, best_effort=True)


def _recovery(coord: Coordinator) -> Recovery:
    """The coordinator's recovery, run from a Data Source's planning or abort (commits run in
    this process: no Spark session is at hand in a Data Source's driver-side worker)."""
    faults = coord.faults

    def fire(point: CrashPoint, epoch: int) -> None:
        if faults is not None:
            faults.fire(point, epoch=epoch)

    logger = get_logger(__name__, uid=coord.sinks[0].uid)
    return Recovery(
        coord.log, coord.sinks, (), allow_non_restored_state=False, fire=fire, logger=logger
    )


def _log_app(coord: Coordinator) -> str | None:
    meta = coord.log.meta()
    return None if meta is None else str(meta["app_id"])
