"""Pipelines the restarting runner executes in a child process (one query run each).

``python -m txsink.runner integration/pipelines.py:run_stream '{"workdir": ..., "sinks": [...]}'``

The pipeline itself ships with txsink (:mod:`txsink.testing.pipelines`), so users' chaos
runs and these tests run the same code; this module keeps the path the tests use.
"""

from __future__ import annotations

from txsink.testing.pipelines import SCHEMA, build_sink, run_stream

__all__ = ["SCHEMA", "build_sink", "run_stream"]
