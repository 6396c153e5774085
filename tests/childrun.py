"""Child pipelines for tests: ``python -m txsink.runner MODULE:FUNCTION ARGS`` restarted as a
user's job is (:func:`txsink.runner.run_until_done`), with every line it printed kept;
``txsink demo``'s restarting run, quiet; and a ``txsink`` command in a child process.

One place for what tests/test_fatal_stop.py, tests/test_demo.py and
integration/test_datasource.py each built for themselves (integration tests import it as
``tests.childrun``, as they do ``tests.streaming``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from txsink.runner import RunReport, python_module_cmd, run_until_done

__all__ = ["cli", "demo", "run_pipeline", "runner_cmd"]


def runner_cmd(pipeline: str, args: Mapping[str, Any]) -> list[str]:
    """The command that runs ``pipeline`` (``module:function`` or ``file.py:function``)
    with ``args`` (passed as JSON) under ``python -m txsink.runner``, with this interpreter."""
    return python_module_cmd("txsink.runner", pipeline, json.dumps(dict(args)))


def run_pipeline(
    cmd: Sequence[str],
    *,
    max_runs: int,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    **more: Any,
) -> tuple[RunReport, list[str]]:
    """Run ``cmd`` until it finishes, at most ``max_runs`` times (``more``: the rest of
    :func:`~txsink.runner.run_until_done`'s keywords, e.g. ``say``, ``on_fatal``); its
    report and every line the runs printed (stdout and stderr merged), for assertions and
    their messages."""
    lines: list[str] = []
    report = run_until_done(
        cmd, env=env, max_runs=max_runs, on_line=lines.append, timeout=timeout, **more
    )
    return report, lines


def demo(workdir: Path, **options: Any) -> dict[str, Any]:
    """``txsink demo``'s restarting run in ``workdir``, without echoing its lines; its
    verdict. ``options`` are :func:`~txsink.connectors.files.demo.run_demo`'s keywords
    (``rows``, ``files``, ``max_runs``, ``crash``, ``via``, ...); unless they say otherwise
    the output is parquet over 2 partitions, with no fault."""
    from txsink.connectors.files.demo import run_demo

    defaults: dict[str, Any] = {"partitions": 2, "crash": None, "fmt": "parquet", "echo": False}
    return run_demo(workdir, **{**defaults, **options})


def cli(*args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``txsink ARGS`` (``python -m txsink.cli``, this interpreter) in a child process, its
    stdout and stderr captured apart as text (``check``: raise on a non-zero exit)."""
    cmd = python_module_cmd("txsink.cli", *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)
