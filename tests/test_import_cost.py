"""What ``import txsink`` costs every process that does it: each Spark Python worker, each
child driver, each CLI call. pandas (about half a second) is imported only by the code
that reads a log as a table (``txsink inspect``, the report), on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Modules an ``import txsink`` (and a connector's, for its tasks) must not load.
HEAVY = ("pandas",)


@pytest.mark.parametrize(
    "module", ["txsink", "txsink.cli", "txsink.testing.pipelines", "txsink.connectors.files"]
)
def test_importing_txsink_loads_no_pandas(module: str) -> None:
    code = f"import sys, {module}; print(sorted(set({HEAVY!r}) & set(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip() == "[]", f"import {module} loads {proc.stdout.strip()}"
