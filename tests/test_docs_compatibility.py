"""docs/compatibility.md's table is the compatibility matrix's (``docs/tools/compatibility.py``),
and the matrix selection is what the page says it is (``tests/matrixrun.py``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.matrixrun import FEATURES

ROOT = Path(__file__).resolve().parent.parent


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "compatibility", ROOT / "docs" / "tools" / "compatibility.py"
    )
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def _rows(block: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in block.splitlines()
        if line.startswith("|")
    ]


def test_the_page_holds_the_table_of_the_latest_results() -> None:
    """Like the module map: with results in integration/.work/matrix/, the page must show
    them (regenerate with ./dev matrix --write-docs); without, the table must still parse,
    one row per feature, one column per measured line."""
    tool = _tool()
    block = tool.block_of((ROOT / "docs" / "compatibility.md").read_text())
    results = tool.load()
    if results:
        assert block == tool.table(results), (
            "docs/compatibility.md is not the table of integration/.work/matrix/: "
            "python docs/tools/compatibility.py --write"
        )
    rows = _rows(block)
    if not rows:
        assert "No matrix results yet" in block
        return
    head, rule, *body = rows
    assert head[0] == "Feature" and set(rule) == {"---"} and len(rule) == len(head)
    assert [row[0] for row in body] == list(FEATURES.values())
    assert all(len(row) == len(head) for row in body), body
    allowed = ("pass (", "refused by design", "**fail**", "not run")
    for row in body:
        for cell in row[1:]:
            assert cell.startswith(allowed), cell


def _result(features: dict[str, list[dict[str, Any]]], line: str = "3.5") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, tests in features.items():
        out[key] = {"passed": 0, "failed": 0, "skipped": 0, "tests": tests}
        for test in tests:
            if test["outcome"] in ("passed", "failed", "skipped"):
                out[key][test["outcome"]] += 1
    return {
        "line": line,
        "pyspark": f"{line}.9",
        "python": "3.11.7",
        "pyarrow": "25.0.0",
        "java": "17.0.2",
        "date": "2026-11-28T13:00:00+00:00",
        "seconds": 120.0,
        "exit_status": 1,
        "features": out,
    }


def _test(outcome: str, reason: str = "", **extra: str) -> dict[str, Any]:
    return {"test": "t.py::x", "outcome": outcome, "reason": reason, "seconds": 1.0, **extra}


def test_each_cell_says_what_the_run_measured(tmp_path: Path) -> None:
    tool = _tool()
    (tmp_path / "4.0-py3.11.json").write_text(
        json.dumps(_result({"foreachBatch": [_test("passed")]}, line="4.0"))
    )
    (tmp_path / "3.5-py3.11.json").write_text(
        json.dumps(
            _result(
                {
                    "foreachBatch": [_test("passed"), _test("failed", "call: AssertionError")],
                    "datasource": [_test("passed", refused="Spark 4.0's API")],
                    "byte_cap": [_test("passed", note="no cap on 3.5")],
                    "connect": [_test("skipped", "no server")],
                }
            )
        )
    )
    results = tool.load(tmp_path)
    assert [r["line"] for r in results] == ["3.5", "4.0"]  # oldest line first
    text = tool.table(results)
    rows = {row[0]: row[1:] for row in _rows(text)}
    assert rows[FEATURES["foreachBatch"]] == ["**fail** (1 of 2)[^1]", "pass (1)"]
    # footnotes are numbered down the rows (connect comes before datasource)
    assert rows[FEATURES["connect"]] == ["not run[^2]", "not run"]
    assert rows[FEATURES["datasource"]] == ["refused by design[^3]", "not run"]
    assert rows[FEATURES["byte_cap"]] == ["pass (1)[^4]", "not run"]
    assert "[^1]: `t.py::x`: call: AssertionError" in text
    assert "[^2]: skipped: no server" in text and "[^3]: Spark 4.0's API" in text
    assert "[^4]: no cap on 3.5" in text
    assert "PySpark 3.5.9, Python 3.11.7, pyarrow 25.0.0, Java 17.0.2; 2026-11-28" in text
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\n{tool.START}\nold\n{tool.END}\n\nafter\n")
    tool.write(page, tmp_path)
    assert tool.block_of(page.read_text()) == text
    assert page.read_text().startswith("# Title\n\n") and page.read_text().endswith("\nafter\n")


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_every_feature_has_a_test_in_the_selection(feature: str) -> None:
    """A feature of the page that no test stands for would always say "not run"."""
    marked = f'matrix("{feature}"'
    sources = [
        p.read_text() for root in ("tests", "integration") for p in (ROOT / root).glob("test_*.py")
    ]
    tagged = any(marked in text for text in sources)
    in_cells = feature in {"foreachBatch", "direct"}  # integration/test_matrix.py's MATRIX_CELLS
    assert tagged or in_cells, f"no test carries @pytest.mark.matrix({feature!r})"
