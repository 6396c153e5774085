"""Load a user's sinks for the operator commands (``--pipeline FILE.py:FUNC``).

Operator commands that reach the targets (list lingering transactions, commit or abort
them, check them before a start) need the sinks configured exactly as the pipeline
configures them: the same uids, connection settings and credentials. Rather than a second
configuration format that could drift from the code, they import the pipeline's own
factory function. It returns a Coordinator, a sink or a list of sinks; or a pair of one
of these and the DataFrame the query writes (``txsink check`` takes its schema; the
other commands ignore it).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from txsink.contract import SinkContract
from txsink.coordinator import Coordinator
from txsink.errors import ConfigurationError
from txsink.sink import TwoPhaseCommitSink

__all__ = ["load_checked", "load_coordinator", "load_sinks"]


def _function(spec: str) -> Any:
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ConfigurationError(
            f"--pipeline {spec!r}: expected FILE.py:FUNCTION or package.module:FUNCTION"
        )
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ConfigurationError(f"--pipeline {spec!r}: no file {path}")
        module_name = f"_txsink_pipeline_{abs(hash(str(path.resolve())))}"
        loaded = importlib.util.spec_from_file_location(module_name, path)
        if loaded is None or loaded.loader is None:
            raise ConfigurationError(f"--pipeline {spec!r}: cannot import {path}")
        module = importlib.util.module_from_spec(loaded)
        sys.modules[module_name] = module
        loaded.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    func = getattr(module, name, None)
    if not callable(func):
        raise ConfigurationError(f"--pipeline {spec!r}: {target} has no function {name!r}")
    return func


def _made(spec: str) -> Any:
    """What ``FUNC()`` returns, the file run first. Spark's ``DATA_SOURCE_NOT_FOUND`` for the
    txsink format (a job that starts its ``format("txsink")`` query while it loads) becomes
    the one-line fix."""
    try:
        return _function(spec)()
    except Exception as err:
        from txsink.datasource import format_not_found

        fix = format_not_found(err)
        if fix is None:
            raise
        raise fix from err


def load_sinks(spec: str) -> list[SinkContract[Any, Any]]:
    """Call ``FUNC()``; it returns a :class:`~txsink.Coordinator`, one sink, or a list."""
    return _sinks_of(_made(spec), spec)


def _split(made: Any) -> tuple[Any, Any]:
    """(pipeline, DataFrame or None) of what the function returned."""
    if isinstance(made, tuple) and len(made) == 2 and not isinstance(made[1], SinkContract):
        from pyspark.sql import DataFrame

        if isinstance(made[1], DataFrame):
            return made[0], made[1]
    return made, None


def _sinks_of(made: Any, spec: str) -> list[SinkContract[Any, Any]]:
    made, _df = _split(made)
    if isinstance(made, Coordinator):
        return list(made.sinks)
    if isinstance(made, SinkContract):
        return [made]
    if isinstance(made, (list, tuple)) and all(isinstance(s, SinkContract) for s in made):
        return list(made)
    raise ConfigurationError(
        f"--pipeline {spec!r} returned {type(made).__name__}: return a Coordinator, a sink "
        "or a list of sinks (configured as in the pipeline: same uids and settings)"
    )


def load_coordinator(spec: str, log: str) -> Coordinator:
    """The pipeline's sinks in a coordinator over ``log`` (a returned coordinator's own
    options, e.g. ``allow_non_restored_state`` and ``retired``, are kept)."""
    return _over_log(_split(_made(spec))[0], spec, log)


def load_checked(spec: str, log: str | None) -> tuple[Coordinator, Any]:
    """The coordinator the query runs (over ``log`` if given) and the DataFrame the
    function returned with it (None if it returned none), for ``txsink check``.

    A sink returned alone is the drop-in ``foreachBatch(sink)``: it needs ``log=`` (or
    ``log``), as at its first batch.
    """
    made, df = _split(_made(spec))
    if log is not None:
        return _over_log(made, spec, log), df
    if isinstance(made, Coordinator):
        return made, df
    if isinstance(made, TwoPhaseCommitSink):
        return made.coordinator(), df
    _sinks_of(made, spec)  # refuses what is not a pipeline
    raise ConfigurationError(
        f"--pipeline {spec!r} returned sinks without a txsink log: pass --log, or return "
        "the Coordinator the query runs"
    )


def _over_log(made: Any, spec: str, log: str) -> Coordinator:
    if isinstance(made, Coordinator):
        return Coordinator(
            made.sinks,
            log=log,
            app_id=made.app_id,
            allow_non_restored_state=made.allow_non_restored_state,
            retired=made.retired,
            retain_epochs=made.retain_epochs,
        )
    return Coordinator(_sinks_of(made, spec), log=log)
