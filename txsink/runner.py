"""Run a query in a subprocess and restart it after each crash until it finishes.

This is the "runner" of DESIGN.md's fault injection: a SIGKILLed driver
cannot restart itself, so a parent process does what a cluster manager (or
a supervisor) would do in production.
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

__all__ = ["RunReport", "run_until_done"]


@dataclass
class RunReport:
    """How a restarting run went."""

    runs: int = 0
    exit_codes: list[int] = field(default_factory=list)
    seconds: float = 0.0
    finished: bool = False

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
    timeout: float = 900.0,
) -> RunReport:
    """Run ``cmd`` until it exits 0, at most ``max_runs`` times.

    ``on_line`` receives every line the child prints (stdout and stderr merged);
    ``on_restart(run, exit_code)`` is called before each restart.
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
        # A watchdog, so a child that hangs silently is ended too.
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            code = proc.wait()
        finally:
            watchdog.cancel()
        report.exit_codes.append(code)
        if code == 0:
            report.finished = True
            break
        if on_restart is not None and report.runs < max_runs:
            on_restart(report.runs, code)
    report.seconds = time.monotonic() - start
    return report


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
    load_callable(args[0])(**kwargs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
