"""Run a query in a subprocess and restart it after each crash until it finishes.

This is the "runner" of DESIGN.md's fault injection: a SIGKILLed driver
cannot restart itself, so a parent process does what a cluster manager (or
a supervisor) would do in production. Unlike a blind supervisor it stops at the
first run that ends on an error a restart cannot help (a configuration error, an
internal error: :func:`txsink.errors.restart_cannot_help`), which the child says
with its exit code :data:`FATAL_EXIT`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from txsink.errors import restart_cannot_help
from txsink.observe.failure import carried_note
from txsink.observe.logs import one_line
from txsink.protocol.faults import FAULT_LINE

__all__ = ["FAILED_LINE", "FATAL_EXIT", "RunReport", "describe_exit", "exit_code", "run_until_done"]

#: How a pipeline's line about its failed query begins (:mod:`txsink.testing.pipelines`).
FAILED_LINE = "txsink: query failed: "
#: The exit code of a query run that ended on an error a restart cannot help
#: (:func:`exit_code`): :func:`run_until_done` stops there instead of restarting. Any other
#: non-zero exit (1: a failure a restart may pass, a signal: a crash) is restarted.
#: 78 is sysexits' EX_CONFIG ("configuration error"), which no crash or pipeline of ours uses.
FATAL_EXIT = 78


def exit_code(err: BaseException) -> int:
    """The exit code of a query run that failed with ``err``: :data:`FATAL_EXIT` when a
    restart would only meet it again (:func:`txsink.errors.restart_cannot_help`), else 1.

    ``err`` may be Spark's exception around a txsink error that reached the user's process
    only as text (the Data Source path: ``PYTHON_DATA_SOURCE_ERROR``, a Spark Connect
    error); the note txsink added to the error (:func:`txsink.observe.failure.mark`) says
    whether a restart can help it."""
    if restart_cannot_help(err):
        return FATAL_EXIT
    note = carried_note(err)
    return FATAL_EXIT if note is not None and note.get("fatal") is True else 1


@dataclass
class RunReport:
    """How a restarting run went."""

    runs: int = 0
    exit_codes: list[int] = field(default_factory=list)
    #: Why each run ended, as its restart line says it (empty for a run that finished).
    endings: list[str] = field(default_factory=list, repr=False)
    seconds: float = 0.0
    finished: bool = False
    #: The last run ended on an error a restart cannot help (exit code :data:`FATAL_EXIT`):
    #: not restarted.
    fatal: bool = field(default=False, repr=False)
    #: What the last failed run said of its failure (its ``txsink: query failed:`` line).
    failure: str = field(default="", repr=False)

    @property
    def restarts(self) -> int:
        return max(0, self.runs - 1)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_until_done(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    max_runs: int = 10,
    on_line: Callable[[str], None] | None = None,
    on_restart: Callable[[int, int], None] | None = None,
    on_start: Callable[[subprocess.Popen[str]], None] | None = None,
    on_fatal: Callable[[int], bool] | None = None,
    timeout: float = 900.0,
    say: Callable[[str], None] | None = None,
    label: str = "query run",
) -> RunReport:
    """Run ``cmd`` until it exits 0, at most ``max_runs`` times; a run that exits with
    :data:`FATAL_EXIT` (an error a restart cannot help) ends it at once (``fatal``).

    ``on_line`` receives every line the child prints (stdout and stderr merged);
    ``on_restart(run, exit_code)`` is called before each restart; ``on_start(process)``
    as each run's child has started. ``on_fatal(run)``, after a run that exited with
    :data:`FATAL_EXIT`, returns whether the cause was fixed meanwhile (an operator mended
    the input, as a chaos run's poison plan does): then the runs go on. ``say``, when given,
    is told the run as a person reads it: each ``txsink:`` line of the child, indented,
    and before each restart one line naming why the run ended, e.g. ``query run 1 ended
    (killed by SIGKILL) after fault after_decision:kill-driver at epoch=0: killing the
    driver (pid 4242); restarting`` (``label`` starts it).
    """
    report = RunReport()
    start = time.monotonic()
    child_env = dict(os.environ if env is None else env)
    while report.runs < max_runs:
        report.runs += 1
        proc = subprocess.Popen(
            list(cmd),
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        if proc.stdout is None:  # pragma: no cover - PIPE was requested
            raise RuntimeError("subprocess has no stdout pipe")
        if on_start is not None:
            on_start(proc)
        # A watchdog, so a child that hangs silently is ended too.
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        seen = _Ending()
        try:
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                seen.read(line)
                if say is not None and line.startswith("txsink:"):
                    say("  " + line)
                if on_line is not None:
                    on_line(line)
            code = proc.wait()
        except BaseException:
            # Interrupted (SIGINT sent to this process alone, as ``pkill -INT`` does, or
            # a callback raised): the child is a query of ours, so it must not outlive
            # us and go on writing unwatched. A query is crash-safe by design, so a
            # SIGKILL after a short grace loses nothing.
            _end(proc)
            raise
        finally:
            watchdog.cancel()
        report.exit_codes.append(code)
        if code == 0:
            report.finished = True
            report.endings.append("")
            break
        report.endings.append(f"{label} {report.runs} ended ({describe_exit(code)}){seen}")
        report.failure = seen.failure
        if code == FATAL_EXIT and (on_fatal is None or not on_fatal(report.runs)):
            report.fatal = True
            if say is not None:
                say(f"{report.endings[-1]}; not restarting: a restart would meet the same error")
            break
        if report.runs < max_runs:
            if on_restart is not None:
                on_restart(report.runs, code)
            if say is not None:
                say(f"{report.endings[-1]}; restarting")
    report.seconds = time.monotonic() - start
    return report


def _end(proc: subprocess.Popen[str], grace: float = 10.0) -> None:
    """End ``proc``: SIGTERM, then SIGKILL if it is still running after ``grace``.

    Safe on a process that has already exited: ``terminate`` then does nothing and
    ``wait`` returns at once."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class _Ending:
    """What a run's lines say about why it ended: its last injected fault, else its
    query's failure."""

    fault: str = ""
    failure: str = ""

    def read(self, line: str) -> None:
        if line.startswith(FAULT_LINE):
            self.fault = line.removeprefix(FAULT_LINE).split(" (state: ")[0]
        elif line.startswith(FAILED_LINE):
            self.failure = line.removeprefix(FAILED_LINE)

    def __str__(self) -> str:
        if self.fault:
            return f" after fault {self.fault}"
        return f": {one_line(self.failure, 160)}" if self.failure else ""


def python_module_cmd(module: str, *args: str) -> list[str]:
    """A command that runs ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def load_callable(spec: str) -> Callable[..., object]:
    """``package.module:function`` or ``path/to/file.py:function``."""
    import importlib
    import importlib.util

    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ValueError(f"expected MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location("_txsink_pipeline", target)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"cannot load {target}")
        module = importlib.util.module_from_spec(module_spec)
        # Registered first, as an import does: a dataclass (or pickle) in the file looks
        # its module up in sys.modules while the file runs.
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    func = getattr(module, name)
    if not callable(func):
        raise TypeError(f"{spec} is not callable")
    return func  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """Child entry point: ``python -m txsink.runner SPEC [JSON_KWARGS]`` runs one pipeline once."""
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m txsink.runner MODULE:FUNCTION [JSON_KWARGS]", file=sys.stderr)
        return 2
    kwargs = json.loads(args[1]) if len(args) > 1 else {}
    try:
        load_callable(args[0])(**kwargs)
    except Exception as err:
        from txsink.datasource import format_not_found

        fix = format_not_found(err)
        if fix is not None:
            print(f"{FAILED_LINE}{fix}", file=sys.stderr, flush=True)  # the fix, not the trace
            return exit_code(fix)
        if not restart_cannot_help(err):
            raise
        # A txsink error that a restart meets again (the pipeline's own set-up refused, say):
        # its one line and FATAL_EXIT, so the restarting parent stops here.
        text = one_line(f"{type(err).__name__}: {err}", 400)
        print(f"{FAILED_LINE}{text}", file=sys.stderr, flush=True)
        return exit_code(err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
