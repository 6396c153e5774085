"""The shape of the house, checked: the core never names a connector, no import circles,
no oversized module, and every registered connector brings what the toolkit needs.

Static checks over the source (the AST), so they cost milliseconds and fail at the line
that breaks the rule.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from txsink import registry
from txsink.testing.adapter import ConnectorTesting, adapters

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "txsink"
CONNECTORS = ROOT / "connectors"
#: Names a core module must not use outside docstrings and comments: the connectors and
#: their client libraries.
CONNECTOR_WORDS = re.compile(
    r"kafka|postgres|psycopg|confluent|\bboto|\bs3a?\b|minio|\bdelta(?:lake)?\b|iceberg", re.I
)
MAX_LINES = 500


def _modules(root: Path) -> Iterator[Path]:
    yield from sorted(root.rglob("*.py"))


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            ids.add(id(body[0].value))
    return ids


def _keys(tree: ast.AST) -> set[int]:
    """String literals used as keys of a document (``{"files": ...}``, ``doc.get("files")``,
    ``doc["files"]``): field names of a file format, not references to a connector."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            ids.update(id(k) for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            ids.add(id(node.slice))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "setdefault", "pop")
            and node.args
        ):
            ids.add(id(node.args[0]))
    return ids


def _names(path: Path) -> Iterator[tuple[int, str, bool]]:
    """Every identifier, import and string literal of a module (not docstrings), and
    whether it is a string literal."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree) | _keys(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docs:
                yield node.lineno, node.value, True
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id, False
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr, False
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name, False) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, node.module or "", False
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            yield node.lineno, node.name, False
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg, False


def test_the_core_never_names_a_connector() -> None:
    """Outside docstrings and comments: no connector or client library by name, no module
    of ``txsink.connectors``, and no string that is a registered connector's name (a
    variable called ``files`` is a word, not the files connector)."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}"
        for path in _modules(CORE)
        for line, text, literal in _names(path)
        if CONNECTOR_WORDS.search(text)
        or text.startswith("txsink.connectors.")
        or (literal and text in registry.connectors())
    ]
    assert not found, "connector names in txsink/:\n" + "\n".join(found)


def _imports(path: Path, package: str) -> set[str]:
    """The ``txsink`` modules a module imports (at any depth of the file)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {name for name in found if name.startswith("txsink")}


def _module_name(path: Path) -> str:
    if path.is_relative_to(CONNECTORS):
        parts = ("txsink", "connectors", *path.relative_to(CONNECTORS).with_suffix("").parts)
    else:
        parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def test_no_import_circles() -> None:
    paths = [*_modules(CORE), *_modules(CONNECTORS)]
    modules = {_module_name(p): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for name_imported in _imports(path, package):
            imported = name_imported
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            # A package's face (__init__) re-exports its modules: importing a module of a
            # package runs the face first, but the face depending on its own modules is
            # not a circle; an arrow to one's own package face is skipped.
            if imported and imported != name and not name.startswith(imported + "."):
                targets.add(imported)
        graph[name] = targets
    circles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_core_imports_connectors_only_through_the_registry() -> None:
    found = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules(CORE)
        for name in _imports(path, _module_name(path))
        if name.startswith("txsink.connectors")
    ]
    assert not found, found


@pytest.mark.parametrize(
    "root", [CORE, CONNECTORS, ROOT / "integration"], ids=["txsink", "connectors", "integration"]
)
def test_no_module_is_oversized(root: Path) -> None:
    """No module over MAX_LINES lines: the core, the connectors, and the harness, chaos
    runs and benchmarks in integration/. Test files aside (``test_*.py``: a list of cases,
    not one job), and what lives in hidden folders (``integration/.work``: build output)."""
    big = {
        str(p.relative_to(ROOT)): n
        for p in _modules(root)
        if not p.name.startswith("test_")
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
        and (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not big, f"modules over {MAX_LINES} lines (one job each): {big}"


def test_every_registered_connector_brings_its_testing_adapter() -> None:
    known = registry.connectors()
    assert known, "no connector is registered: is txsink installed (pip install -e .)?"
    found = adapters()
    assert sorted(found) == sorted(known)
    for name, adapter in found.items():
        assert isinstance(adapter, ConnectorTesting) and adapter.name == name
        assert adapter.variants, f"{name}: no variant to test"


def test_the_architecture_doc_maps_every_module() -> None:
    """docs/architecture.md's module map (``docs/tools/module_map.py``) names every module,
    and no module that is gone."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    mapped: set[str] = set()
    folder = ""
    for line in doc.splitlines():
        if heading := re.match(r"\*\*`([^`]+/)`\*\*", line):
            folder = heading.group(1)
        elif row := re.match(r"\| `([^`]+\.py)` \|", line):
            mapped.add(folder + row.group(1))
    on_disk = {str(p.relative_to(ROOT)) for root in (CORE, CONNECTORS) for p in root.rglob("*.py")}
    assert mapped == on_disk, (
        f"regenerate the map (python docs/tools/module_map.py): missing "
        f"{sorted(on_disk - mapped)}, gone {sorted(mapped - on_disk)}"
    )
