"""Run a pipeline under a chaos plan until it is done, and judge every sink.

The pipeline runs in a child process (``python -m txsink.runner SPEC JSON``) that
:func:`txsink.runner.run_until_done` restarts after every crash, the way a supervisor
would. Afterwards:

- restarts come from the runner;
- crash times from the fault markers (each firing writes ``at=<time>`` into the plan's
  state folder before it crashes anything);
- recovery time, per crash: from the crash to the first epoch the txsink log marks
  committed after it (``committed.json``'s ``committed_at``), i.e. until the pipeline made
  progress again. Both clocks are the wall clock of this machine;
- one :class:`~txsink.testing.verifiers.Verdict` per sink from its verifier.

Given ``targets``, a :class:`~txsink.testing.chaos.targetcrash.TargetCrashes` serves the plan's
``kill-target`` faults (and ``kill_target_after``, a kill at a moment of the clock): the
server dies, stays down ``down_s``, and every server is up again before the child restarts.

A run may also carry a disturbance (:mod:`txsink.testing.disturb`): a second live driver
of the same query (it must be refused, and the first must finish undisturbed), or a
poison record in the input (its epoch must be refused before the decision; the run then
fixes the input and restarts, as an operator would).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txsink.contract import SinkContract
from txsink.ops.audit import audit_log
from txsink.ops.audit.table import render_text, summary_line
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import open_log
from txsink.protocol.rounds import OUTAGE_ENV
from txsink.testing.chaos.plan import ChaosPlan
from txsink.testing.chaos.targetcrash import TargetControl, TargetCrashes
from txsink.testing.disturb import Disturbed, Poison, SecondDriver
from txsink.testing.observer import Observer, Target
from txsink.testing.tables import format_table
from txsink.testing.verifiers import SinkVerifier, Verdict, verify

__all__ = ["ChaosReport", "run_chaos"]


@dataclass
class ChaosReport:
    """What one chaos run did, and the verdict for each sink."""

    plan: str
    finished: bool
    runs: int
    exit_codes: list[int]
    seconds: float
    faults_planned: int
    faults_fired: list[str]
    crash_times: list[float]
    recovery_seconds: list[float | None]
    epochs_committed: int | None
    verdicts: dict[str, Verdict]
    errors: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    notes: list[str] = field(default_factory=list)
    #: One line per server the run killed: ``NAME killed by CAUSE, down 2.3s``.
    target_kills: list[str] = field(default_factory=list)
    #: What concurrent readers saw during the run (``observe=``): the observer's
    #: violations, the history checker's among them; each one counts as a violation.
    observed: list[str] = field(default_factory=list)
    #: Samples the readers took, per view (``observe=``).
    samples: dict[str, int] = field(default_factory=dict)
    #: The run's disturbance (``second-driver@...``, ``poison=...``), if any.
    disturbance: str = ""
    #: What the disturbance showed (the second driver's ending, the poison's refusal).
    disturbance_notes: list[str] = field(default_factory=list)
    #: Where the disturbance was not handled as it must be; each counts as a violation.
    disturbance_violations: list[str] = field(default_factory=list)
    #: ``txsink audit --deep``'s summary line after the run (``audit=``); a failed audit is
    #: an error (``errors["audit"]``) as well.
    audit: str = ""

    @property
    def restarts(self) -> int:
        return max(0, self.runs - 1)

    @property
    def violations(self) -> int:
        """Sinks that fail the exactly-once check or could not be read, +1 if unfinished."""
        bad = sum(1 for v in self.verdicts.values() if not v.ok) + len(self.errors)
        bad += len(self.disturbance_violations)
        return bad + len(self.observed) + (0 if self.finished else 1)

    @property
    def ok(self) -> bool:
        return self.violations == 0

    @property
    def recovery_median(self) -> float | None:
        known = [s for s in self.recovery_seconds if s is not None]
        return statistics.median(known) if known else None

    @property
    def recovery_max(self) -> float | None:
        known = [s for s in self.recovery_seconds if s is not None]
        return max(known) if known else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "seed": self.seed,
            "ok": self.ok,
            "finished": self.finished,
            "runs": self.runs,
            "restarts": self.restarts,
            "exit_codes": self.exit_codes,
            "seconds": round(self.seconds, 1),
            "faults_planned": self.faults_planned,
            "faults_fired": len(self.faults_fired),
            "recovery_seconds": [None if s is None else round(s, 2) for s in self.recovery_seconds],
            "epochs_committed": self.epochs_committed,
            "violations": self.violations,
            "sinks": {name: v.as_dict() for name, v in self.verdicts.items()},
            "errors": self.errors,
            "notes": self.notes,
            "target_kills": self.target_kills,
            "observed": self.observed,
            "samples": self.samples,
            "audit": self.audit,
            **(
                {
                    "disturbance": self.disturbance,
                    "disturbance_notes": self.disturbance_notes,
                    "disturbance_violations": self.disturbance_violations,
                }
                if self.disturbance
                else {}
            ),
        }

    def table(self) -> str:
        """A summary: one line for the run, one row per sink."""
        rec = _fmt_s(self.recovery_max)
        what = self.plan or self.disturbance or "(no faults)"
        head = (
            f"plan {what}: {'finished' if self.finished else 'NOT FINISHED'}"
            f" in {self.runs} run(s), {self.restarts} restart(s), faults fired "
            f"{len(self.faults_fired)}/{self.faults_planned}, recovery max {rec}, "
            f"{self.seconds:.1f}s"
        )
        if self.target_kills:
            head += "\nservers killed: " + "; ".join(self.target_kills)
        if self.disturbance:
            head += f"\ndisturbance {self.disturbance}: " + "; ".join(self.disturbance_notes)
        head += "".join(f"\n  VIOLATION: {v}" for v in self.disturbance_violations)
        if self.samples:
            head += "\nreaders during the run: " + ", ".join(
                f"{name} {n} samples" for name, n in self.samples.items()
            )
        head += "".join(f"\n  VIOLATION seen by a reader: {v}" for v in self.observed)
        if self.audit:
            head += f"\n{self.audit}"
        cols = (
            "sink",
            "expected",
            "written",
            "dup",
            "missing",
            "unexpected",
            "lingering",
            "epochs",
            "verdict",
        )
        rows: list[tuple[object, ...]] = [
            (
                name,
                v.rows_expected,
                v.rows_written,
                v.duplicates,
                v.missing,
                v.unexpected,
                v.lingering,
                v.epochs,
                "ok" if v.ok else "FAIL",
            )
            for name, v in self.verdicts.items()
        ]
        rows += [
            (name, "-", "-", "-", "-", "-", "-", "-", f"ERROR {err[:60]}")
            for name, err in self.errors.items()
        ]
        return head + "\n" + format_table(cols, rows)

    def assert_ok(self) -> None:
        """Raise ``AssertionError`` with the summary table unless every sink is exactly-once."""
        if not self.ok:
            raise AssertionError("chaos run failed the exactly-once check\n" + self.table())


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def run_chaos(
    pipeline: str,
    plan: ChaosPlan | str,
    *,
    workdir: str | os.PathLike[str],
    sinks_verifiers: Mapping[str, SinkVerifier],
    args: Mapping[str, Any] | None = None,
    log: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    max_runs: int = 10,
    timeout: float = 900.0,
    on_progress: Callable[[str], None] | None = None,
    targets: Mapping[str, TargetControl] | None = None,
    down_s: float = 2.0,
    kill_target_after: tuple[float, str | None] | None = None,
    observe: Sequence[Target] = (),
    expected_epochs: Mapping[int, Sequence[int]] | None = None,
    disturbance: SecondDriver | Poison | None = None,
    input_dir: str | os.PathLike[str] | None = None,
    audit: Sequence[SinkContract[Any, Any]] = (),
) -> ChaosReport:
    """Run ``pipeline`` under ``plan`` until it finishes (or ``max_runs``), then verify.

    Args:
        pipeline: ``path/to/file.py:function`` or ``package.module:function``; it runs one
            streaming query to the end of its input (e.g. ``trigger(availableNow=True)``)
            and raises or exits non-zero when the query fails.
        plan: a :class:`ChaosPlan` or a ``txsink.protocol.faults`` spec.
        workdir: a folder of the caller's; the fault state goes to ``workdir/faults``
            (emptied first, so the plan fires afresh).
        sinks_verifiers: sink name -> verifier, read once the run is over.
        args: the pipeline's keyword arguments (JSON-serialisable).
        log: the pipeline's txsink log, for recovery times (default ``workdir/txlog``).
        env: added to the child's environment.
        max_runs: give up after this many runs of the child.
        timeout: seconds one run of the child may take before it is killed.
        on_progress: receives one human-readable line per event.
        targets: name -> control of each target server the plan may kill
            (``kill-target`` faults; see :mod:`txsink.testing.chaos.targetcrash`). The child
            then runs with ``TXSINK_OUTAGE_S=0`` unless ``env`` sets it: a killed server
            stays down until the child restarts, so no epoch could ride its outage out.
        down_s: how long a killed server stays down.
        kill_target_after: ``(seconds, name)``: also kill ``name`` (``None``: every
            target) that many seconds after the first run started.
        observe: views to read concurrently during the whole run (an
            :class:`~txsink.testing.observer.Observer`: all-or-nothing across targets,
            and the history checker of :mod:`txsink.testing.history`); needs
            ``expected_epochs`` (epoch -> its ids; :func:`~txsink.testing.input_epochs`).
        disturbance: a second driver or a poison record (:mod:`txsink.testing.disturb`);
            a poison is written into ``input_dir`` (default ``workdir/input``) first.
        audit: the pipeline's sinks, built in this process as the child builds them: after
            the run, ``txsink audit --deep`` of every committed epoch in their targets
            (:mod:`txsink.ops.audit`) must pass too.
    """
    chaos = plan if isinstance(plan, ChaosPlan) else ChaosPlan.parse(plan)
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    state = root / "faults"
    shutil.rmtree(state, ignore_errors=True)
    say = on_progress or (lambda _line: None)

    from txsink.runner import run_until_done

    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env.pop("TXSINK_FAULT", None)
    child_env.pop("TXSINK_FAULT_STATE", None)
    if targets:  # a killed server stays down until the child restarts: nothing to ride out
        child_env.setdefault(OUTAGE_ENV, "0")
    if chaos.faults:
        child_env["TXSINK_FAULT"] = chaos.spec
        child_env["TXSINK_FAULT_STATE"] = str(state)
    command = [sys.executable, "-m", "txsink.runner", pipeline, json.dumps(dict(args or {}))]

    log_location = os.fspath(log) if log is not None else str(root / "txlog")
    seen: set[int] = set()
    disturbed = Disturbed(
        disturbance,
        command=command,
        env={k: v for k, v in child_env.items() if k not in ("TXSINK_FAULT", "TXSINK_FAULT_STATE")},
        input_dir=Path(input_dir) if input_dir is not None else root / "input",
        timeout=timeout,
        say=say,
    )

    def on_line(line: str) -> None:
        told = _TOLD_COMMIT.match(line)
        if told:  # the child said it itself (txsink's default output)
            seen.add(int(told.group(1)))
        _report_commits(log_location, seen, say)
        disturbed.on_line(line, seen)

    crashes = None if not targets else TargetCrashes(state, targets, down_s=down_s)

    def on_restart(_run: int, _code: int) -> None:
        _report_commits(log_location, seen, say)
        if crashes is not None:
            crashes.restore()  # the servers come back before the query does
        disturbed.on_restart()

    if observe and expected_epochs is None:
        raise ValueError("run_chaos: observe= needs expected_epochs (epoch -> its ids)")
    observer = Observer(observe, expected_epochs or {}) if observe else None
    say(f"chaos: {pipeline} under {chaos}")
    if observer is not None:
        observer.start()
    if crashes is not None:
        crashes.start()
        if kill_target_after is not None:
            crashes.kill_after(*kill_target_after)
    disturbed.start()
    try:
        runner = run_until_done(
            command,
            env=child_env,
            max_runs=max_runs,
            on_line=on_line,
            on_restart=on_restart,
            on_start=disturbed.on_start,
            on_fatal=lambda _run: disturbed.fixable(),
            timeout=timeout,
            say=say,
            label="run",
        )
    finally:
        if crashes is not None:
            crashes.stop()
        watched = None if observer is None else observer.stop()
        disturbed.stop()
    _report_commits(log_location, seen, say)
    disturbed.judge(runner)
    fired = _fired(state)
    timed = [k.at for k in crashes.kills if k.cause.startswith("timer")] if crashes else []
    crash_times = sorted([t for _, t in fired] + timed)
    commits, log_error = _commit_times(log_location)
    recovery = [_recovery(t, commits) for t in crash_times]
    verdicts: dict[str, Verdict] = {}
    errors: dict[str, str] = {}
    if crashes is not None and crashes.errors:
        errors["target crashes"] = "; ".join(crashes.errors)[:500]
    for name, verifier in sinks_verifiers.items():
        try:
            verdicts[name] = verify(verifier)
        except Exception as err:  # a verifier that cannot read is a failed verdict
            errors[name] = f"{type(err).__name__}: {err}"
    audited = _audit(log_location, audit, errors) if audit else ""
    report = ChaosReport(
        plan=chaos.spec,
        audit=audited,
        finished=runner.finished,
        runs=runner.runs,
        exit_codes=list(runner.exit_codes),
        seconds=runner.seconds,
        faults_planned=chaos.crashes_expected,
        faults_fired=[text for text, _ in fired],
        crash_times=crash_times,
        recovery_seconds=recovery,
        epochs_committed=None if commits is None else len(commits),
        verdicts=verdicts,
        errors=errors,
        seed=chaos.seed,
        notes=[log_error] if log_error else [],
        target_kills=[
            f"{k.target} killed by {k.cause}, down {_fmt_s(k.down_s)}"
            for k in (crashes.kills if crashes else [])
        ],
        observed=[] if watched is None else list(watched.violations),
        samples={} if watched is None else dict(watched.samples),
        disturbance="" if disturbance is None else str(disturbance),
        disturbance_notes=disturbed.notes,
        disturbance_violations=disturbed.violations,
    )
    say(
        f"chaos: {'ok' if report.ok else 'FAILED'}: {report.restarts} restart(s), "
        f"{len(report.faults_fired)}/{report.faults_planned} fault(s) fired, "
        f"{report.violations} violation(s), recovery max {_fmt_s(report.recovery_max)}"
    )
    return report


def _audit(location: str, sinks: Sequence[SinkContract[Any, Any]], errors: dict[str, str]) -> str:
    """``txsink audit --deep`` of the run's committed epochs, in the sinks that can be audited
    as configured (``SinkContract.auditable``); a failure goes to ``errors``."""
    left_out = [s.uid for s in sinks if not s.auditable]
    sinks = [s for s in sinks if s.auditable]
    if not sinks:
        return f"audit: no sink can be audited as configured ({', '.join(left_out)})"
    try:
        report = audit_log(open_log(location), sinks, deep=True)
    except Exception as err:
        errors["audit"] = f"{type(err).__name__}: {err}"[:500]
        return f"audit: could not run ({type(err).__name__})"
    if not report.ok:
        errors["audit"] = render_text(report, all_rows=False)[:1500]
    unaudited = f" (not auditable as configured: {', '.join(left_out)})" if left_out else ""
    return summary_line(report) + unaudited


#: txsink's own line for a committed epoch (see txsink.observe.logs): the child told it already.
_TOLD_COMMIT = re.compile(r"txsink: \[[^\]]* epoch (\d+)\] committed: ")


def _fired(state: Path) -> list[tuple[str, float]]:
    """(marker text, firing time) of every fault that fired, from the plan's state folder."""
    out = []
    for name in sorted(FaultPlan((), str(state)).fired()) if state.is_dir() else []:
        text = (state / name).read_text().strip()
        stamp = next((w[3:] for w in text.split() if w.startswith("at=")), "")
        try:
            out.append((text, float(stamp)))
        except ValueError:
            continue
    return out


def _commit_times(location: str) -> tuple[list[tuple[int, float]] | None, str | None]:
    """(epoch, committed_at) of every committed epoch of the log, or an error text."""
    from txsink.protocol.log import open_log

    try:
        log = open_log(location)
        return (
            sorted(
                (s.epoch, s.committed.committed_at) for s in log.states() if s.committed is not None
            ),
            None,
        )
    except Exception as err:
        return None, f"cannot read the txsink log at {location}: {type(err).__name__}: {err}"


def _recovery(crash: float, commits: list[tuple[int, float]] | None) -> float | None:
    later = [at for _, at in commits or [] if at >= crash]
    return min(later) - crash if later else None


def _report_commits(location: str, seen: set[int], say: Callable[[str], None]) -> None:
    """Say "epoch N committed" for epochs newly committed in a local log (cheap listing)."""
    if "://" in location and not location.startswith("file://"):
        return
    folder = Path(location.removeprefix("file://"), "epochs")
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in sorted(names):
        if name.isdigit() and int(name) not in seen and (folder / name / "committed.json").exists():
            seen.add(int(name))
            say(f"  epoch {int(name)} committed")
