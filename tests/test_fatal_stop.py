"""The restarting runner and the demo stop at the first error a restart cannot help.

Issue #38: the demo met a configuration error at its first batch and restarted the query
nine times on it (220 s, 0 rows). A child run now exits with
:data:`txsink.runner.FATAL_EXIT` on such an error (:func:`txsink.errors.restart_cannot_help`)
and :func:`txsink.runner.run_until_done` stops there, with that exit code and the error's
line; any other failure (a crash, a retryable error) is still restarted.

The children are real processes (``python -m txsink.runner THIS_FILE.py:FUNC``); only
the last test starts Spark, for the path a real first batch takes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.childrun import run_pipeline, runner_cmd
from txsink.errors import (
    CommitError,
    ConfigurationError,
    DriverLeaseError,
    EpochAbortedError,
    EpochBlockedError,
    InjectedFault,
    InternalError,
    LogUnavailableError,
    RetryableError,
    UnreachableError,
    UnsupportedSparkError,
    WriteError,
    restart_cannot_help,
)
from txsink.runner import FATAL_EXIT, exit_code

HERE = Path(__file__).resolve()


# -- pipelines the children run -----------------------------------------------------------


def refused(**_: Any) -> None:
    """A pipeline whose set-up is refused: a restart would meet the same refusal."""
    raise ConfigurationError("the sink's setting is wrong: fix it", sink_uid="out", phase="check")


def fails_once(state: str) -> None:
    """A pipeline whose first run meets a transient failure, and whose second run passes."""
    if not Path(state).exists():
        Path(state).write_text("failed once")
        raise RetryableError("the target did not answer for a moment", sink_uid="out")


def refused_until_fixed(state: str) -> None:
    """A pipeline refused until an operator fixes its cause (the file ``state`` appears)."""
    if not Path(state).exists():
        raise ConfigurationError("the input has a row no target takes", phase="check")


def _cmd(func: str, **kwargs: Any) -> list[str]:
    return runner_cmd(f"{HERE}:{func}", kwargs)


# -- which errors end the runs ------------------------------------------------------------


@pytest.mark.parametrize(
    ("err", "fatal"),
    [
        (ConfigurationError("x"), True),
        (UnsupportedSparkError("x"), True),
        (InternalError("x"), True),
        (WriteError("x"), True),
        (DriverLeaseError("another driver runs it"), False),
        (UnreachableError("cannot connect to PostgreSQL at host=db"), False),
        (RetryableError("x"), False),
        (LogUnavailableError("x"), False),
        (InjectedFault("x"), False),
        (EpochBlockedError("the topic refuses the record", fix="raise max.message.bytes"), True),
        (CommitError("the broker did not answer the commit"), False),
        (EpochAbortedError("x", causes=[WriteError("bad row")]), True),
        (EpochAbortedError("x", causes=[WriteError("bad"), InjectedFault("crash")]), False),
        (EpochAbortedError("x"), False),
        (ValueError("x"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_which_errors_a_restart_cannot_help(err: BaseException, fatal: bool) -> None:
    assert restart_cannot_help(err) is fatal


def test_the_runner_stops_at_the_first_error_a_restart_cannot_help() -> None:
    said: list[str] = []
    report, _ = run_pipeline(_cmd("refused"), max_runs=5, say=said.append, timeout=120)
    assert (report.runs, report.exit_codes, report.fatal) == (1, [FATAL_EXIT], True), said
    assert not report.finished
    assert "ConfigurationError" in report.failure and "fix it" in report.failure
    assert said[-1].endswith("not restarting: a restart would meet the same error"), said


@pytest.mark.parametrize(
    ("err", "code"),
    [(ConfigurationError("bad option", phase="check"), FATAL_EXIT), (RetryableError("x"), 1)],
    ids=["configuration", "retryable"],
)
def test_an_error_that_reached_the_process_only_as_sparks_text_keeps_its_exit_code(
    err: BaseException, code: int
) -> None:
    """The Data Source path: the txsink error raised in Spark's Python worker reaches the
    user's process inside Spark's exception, as text with txsink's note (a
    ``PYTHON_DATA_SOURCE_ERROR``). The note says whether a restart can help it."""
    from txsink.observe.failure import mark

    mark(err, f"{type(err).__name__}: {err}", printed=False)
    wrapped = RuntimeError(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: "
        "Traceback (most recent call last):\n  ...\n" + "\n".join(getattr(err, "__notes__", []))
    )
    assert exit_code(wrapped) == code
    assert exit_code(RuntimeError("a crash with no note")) == 1


def test_the_runner_goes_on_when_the_cause_of_a_fatal_error_was_fixed(tmp_path: Path) -> None:
    """``on_fatal``: the operator fixes the cause (a chaos run's poison plan mends the
    input) and the runs go on; without a fix they end at the first such error."""
    state = tmp_path / "fixed"
    fixes: list[int] = []

    def fix(run: int) -> bool:
        fixes.append(run)
        state.write_text("the input mended")
        return True

    cmd = _cmd("refused_until_fixed", state=str(state))
    report, _ = run_pipeline(cmd, max_runs=5, on_fatal=fix, timeout=120)
    assert (report.runs, report.exit_codes, report.finished) == (2, [FATAL_EXIT, 0], True)
    assert fixes == [1] and not report.fatal
    state.unlink()
    report, _ = run_pipeline(cmd, max_runs=5, on_fatal=lambda _run: False, timeout=120)
    assert (report.runs, report.fatal) == (1, True), report


@pytest.mark.spark
def test_a_data_source_query_refused_for_a_bad_option_is_not_restarted(tmp_path: Path) -> None:
    """format("txsink") with an option its connector does not take: the refusal reaches the
    user's process only inside Spark's exception, and still ends the runs after one."""
    from txsink.testing.inputs import make_input

    make_input(tmp_path / "input", 10, 1)
    options = {"connector": "files", "path": str(tmp_path / "out"), "uid": "out", "servr": "x"}
    args = {"workdir": str(tmp_path), "options": options, "partitions": 1}
    pipeline = "txsink.testing.pipelines:run_datasource"
    report, _ = run_pipeline(runner_cmd(pipeline, args), max_runs=3)
    assert (report.runs, report.exit_codes, report.fatal) == (1, [FATAL_EXIT], True), report
    assert "unknown option(s) ['servr']" in report.failure, report.failure


def test_the_runner_still_restarts_after_a_retryable_error(tmp_path: Path) -> None:
    state = tmp_path / "state"
    report, _ = run_pipeline(_cmd("fails_once", state=str(state)), max_runs=5, timeout=120)
    assert (report.runs, report.finished, report.fatal) == (2, True, False), report
    assert report.exit_codes == [1, 0]


def test_the_demo_stops_at_the_first_error_a_restart_cannot_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``txsink demo`` ends with the child's exit code and the error in its verdict, after
    one run, instead of restarting (the demo's child pipeline swapped for one refused at
    its start)."""
    import argparse

    import txsink.runner
    from txsink.connectors.files import demo

    monkeypatch.setattr(txsink.runner, "python_module_cmd", lambda *_: _cmd("refused"))
    args = argparse.Namespace(
        workdir=tmp_path / "demo",
        rows=10,
        files=1,
        partitions=1,
        crash=None,
        format="parquet",
        max_runs=10,
        via="foreachBatch",
    )
    assert demo.demo_command(args) == FATAL_EXIT
    verdict = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert verdict["restarts"] == 0 and not verdict["ok"], verdict
    assert verdict["error"].startswith("ConfigurationError: [sink_uid=out, phase=check]"), verdict


@pytest.mark.spark
def test_a_first_batch_refused_by_its_check_is_not_restarted(tmp_path: Path) -> None:
    """The whole path on the installed Spark: the streaming pipeline's first batch, whose
    files sink cannot create its folder (a configuration error of its check), ends the
    restarting run after one run with the sink's own message."""
    from txsink.testing.inputs import make_input

    make_input(tmp_path / "input", 10, 1)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the sink wants a folder")
    spec = {"kind": "files", "path": str(blocked / "out"), "uid": "out"}
    args = {"workdir": str(tmp_path), "sinks": [spec], "partitions": 1}
    pipeline = "txsink.testing.pipelines:run_stream"
    report, _ = run_pipeline(runner_cmd(pipeline, args), max_runs=3)
    assert (report.runs, report.exit_codes, report.fatal) == (1, [FATAL_EXIT], True), report
    assert "cannot create the output folder" in report.failure, report.failure
