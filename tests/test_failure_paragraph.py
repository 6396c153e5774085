"""One failure, one paragraph (:mod:`txsink.observe.failure`), without Spark: the note a txsink
error carries through Spark's texts, and the hook that prints an uncaught one as its
paragraph and a trace file's path, while any other error goes to the previous hook as is.
The real runs (``python job.py`` against real servers) are integration/test_one_paragraph.py.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from txsink.errors import ConfigurationError
from txsink.observe import failure as _failure
from txsink.observe.logs import get_logger, log_failure


def _failed(text: str = "table t does not exist: create it") -> ConfigurationError:
    err = ConfigurationError(text, sink_uid="pg", phase="check", connector="postgres")
    log_failure(get_logger("txsink.test"), err, epoch=0)
    return err


def _wrapped(err: BaseException) -> RuntimeError:
    """What Spark makes of it: py4j's return message, the Python traceback as text."""
    text = "".join(traceback.format_exception(err))
    return RuntimeError(f"[STREAM_FAILED] An exception was raised by the Python Proxy: {text}")


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    monkeypatch.setenv(_failure.TRACE_DIR_ENV, str(tmp_path / "traces"))
    monkeypatch.delenv(_failure.TRACEBACK_ENV, raising=False)
    passed: list[Any] = []
    monkeypatch.setattr(_failure, "_previous", [lambda *a: passed.append(a)])
    return passed


def test_a_logged_txsink_error_carries_its_paragraph_through_a_wrapping_text() -> None:
    err = _failed()
    doc = _failure.carried_note(_wrapped(err))
    assert doc is not None
    assert doc["paragraph"] == (
        "[pg epoch 0] ConfigurationError: [sink_uid=pg, phase=check, connector=postgres] "
        "table t does not exist: create it"
    )
    assert doc["type"] == "ConfigurationError"
    assert [n for n in err.__notes__ if n.startswith(_failure.MARKER)] == [
        _failure.MARKER + json.dumps(doc)
    ]  # once, even when logged again
    log_failure(get_logger("txsink.test"), err, epoch=0)
    assert len(err.__notes__) == 1


def test_another_error_carries_no_note() -> None:
    err = ValueError("a bug of the user's")
    log_failure(get_logger("txsink.test"), err, epoch=0)
    assert not getattr(err, "__notes__", None)
    assert _failure.carried_note(_wrapped(err)) is None


def test_the_hook_prints_the_paragraph_and_the_trace_file(
    hook: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _failed()
    wrapped = _wrapped(err)
    # Printed by another process (a Spark Connect server): the client prints it.
    monkeypatch.setattr("txsink.observe.failure.os.getpid", lambda: -1)
    monkeypatch.setattr("txsink.observe.failure.socket.gethostname", lambda: "elsewhere")
    out = io.StringIO()
    _failure.excepthook(RuntimeError, wrapped, wrapped.__traceback__, stream=out)
    lines = out.getvalue().splitlines()
    assert hook == []
    assert lines[0] == (
        "txsink: ERROR [pg epoch 0] ConfigurationError: [sink_uid=pg, phase=check, "
        "connector=postgres] table t does not exist: create it"
    )
    assert lines[1].startswith("txsink: the query stopped on this error (RuntimeError)")
    path = Path(lines[1].rsplit(" is in ", 1)[1])
    assert path.parent == (tmp_path / "traces").resolve()
    assert "table t does not exist" in path.read_text()
    assert "[STREAM_FAILED]" in path.read_text()
    assert len(lines) == 2


def test_the_hook_does_not_print_again_what_this_console_printed(hook: list[Any]) -> None:
    logging.getLogger("txsink").handlers.clear()
    from txsink.observe.logs import configure_logging

    configure_logging("info")  # txsink's console handler, on stderr
    try:
        wrapped = _wrapped(_failed())
    finally:
        logging.getLogger("txsink").handlers.clear()
    out = io.StringIO()
    _failure.excepthook(RuntimeError, wrapped, None, stream=out)
    (line,) = out.getvalue().splitlines()
    assert line.startswith("txsink: the query stopped on the error above (RuntimeError); ")
    assert "does not exist" not in line


def test_other_errors_and_full_tracebacks_go_to_the_previous_hook(
    hook: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = ValueError("not txsink's")
    out = io.StringIO()
    _failure.excepthook(ValueError, plain, None, stream=out)
    assert hook == [(ValueError, plain, None)] and out.getvalue() == ""
    monkeypatch.setenv(_failure.TRACEBACK_ENV, "full")
    wrapped = _wrapped(_failed())
    _failure.excepthook(RuntimeError, wrapped, None, stream=out)
    assert hook[-1] == (RuntimeError, wrapped, None) and out.getvalue() == ""


def test_the_hook_is_installed_only_over_pythons_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_failure.TRACEBACK_ENV, raising=False)

    def users(*args: Any) -> None: ...

    monkeypatch.setattr(sys, "excepthook", users)
    _failure.install_excepthook()
    assert sys.excepthook is users
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(_failure, "_previous", [sys.__excepthook__])
    _failure.install_excepthook()
    assert sys.excepthook is _failure.excepthook
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setenv(_failure.TRACEBACK_ENV, "full")
    _failure.install_excepthook()
    assert sys.excepthook is sys.__excepthook__


def test_a_failed_tasks_error_no_coordinator_told_is_printed_by_the_hook(
    hook: list[Any], tmp_path: Path
) -> None:
    """The Data Source path: the query ends on a task's failure, which carries only the
    task's note (:mod:`txsink.protocol.taskerror`); the hook prints it as the paragraph."""
    from txsink.errors import RetryableError
    from txsink.protocol.taskerror import mark

    err = RetryableError("cannot connect", sink_uid="pg", epoch=2, partition=1, phase="begin")
    try:
        raise mark(err)
    except RetryableError as raised:
        wrapped = _wrapped(raised)
    out = io.StringIO()
    _failure.excepthook(RuntimeError, wrapped, None, stream=out)
    first, second = out.getvalue().splitlines()
    assert first == (
        "txsink: ERROR [pg epoch 2] RetryableError: [sink_uid=pg, epoch=2, partition=1, "
        "phase=begin] cannot connect"
    )
    assert second.startswith("txsink: the query stopped on this error (RuntimeError); ")
    assert hook == [] and _failure.ended_by_failure()
