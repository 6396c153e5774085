"""The old module paths (before the rooms of issue #36) still import, as the very module
objects of their new homes: users and third-party connectors change nothing.

rooms-rewrite: skip (this file names the old paths on purpose)
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import txsink
from txsink._moved import MOVED

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_is_its_new_module(old: str, new: str) -> None:
    moved = importlib.import_module(old)
    home = importlib.import_module(new)
    assert moved is home
    # the module stays itself: its name and spec are its new home's
    assert home.__name__ == new and home.__spec__ is not None and home.__spec__.name == new


def test_names_from_an_old_path_are_the_same_objects() -> None:
    from txsink.log import TxLog, open_log  # type: ignore[import-not-found,unused-ignore]

    from txsink.protocol.log import TxLog as Home
    from txsink.protocol.log import open_log as home_open

    assert TxLog is Home and open_log is home_open
    import txsink.faults  # type: ignore[import-not-found,unused-ignore]

    assert txsink.faults.FaultPlan is txsink.FaultPlan


def test_an_old_path_imports_first_in_a_fresh_process() -> None:
    """The finder is in place before the old path is looked for (txsink's face installs
    it), also when that is the process's first import of txsink."""
    code = (
        "import txsink.inspect, txsink._target.formats as f, txsink.ops.inspect as i; "
        "assert txsink.inspect is i and f.__name__ == 'txsink.kit.formats'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_public_name_imports() -> None:
    for name in txsink.__all__:
        assert getattr(txsink, name) is not None, name


def test_every_module_path_the_docs_name_imports() -> None:
    """``txsink.x.y`` in docs/ and README.md, where it names a module of txsink (not an
    attribute, a metric or a logger), imports."""
    found: set[str] = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        found.update(re.findall(r"\btxsink(?:\.[a-z_][a-z0-9_]*)+", doc.read_text()))
    checked = 0
    for dotted in sorted(found):
        parts = dotted.split(".")
        # the longest prefix that is a file or folder of the package is a module path
        for n in range(len(parts), 1, -1):
            rel = Path(*parts[1:n])
            if (ROOT / "txsink" / rel).with_suffix(".py").exists() or (
                ROOT / "txsink" / rel / "__init__.py"
            ).exists():
                importlib.import_module(".".join(parts[:n]))
                checked += 1
                break
    assert checked > 20
