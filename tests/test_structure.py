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


def test_the_architecture_doc_counts_todays_arrows_between_the_rooms() -> None:
    """The table of imports between the rooms in docs/architecture.md is today's (the
    numbers come from the code, so a stale table would claim a layering the code lost)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("module_map", ROOT / "docs/tools/module_map.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc[doc.index(tool.ARROWS_START) + len(tool.ARROWS_START) : doc.index(tool.ARROWS_END)]
    assert table.strip() == "\n".join(tool.arrows()), (
        "the arrows table is stale: python docs/tools/module_map.py --write"
    )


# -- the rooms (issue #36) -----------------------------------------------------------------

#: The rooms of txsink/, bottom to top, and the rooms each may import (its own included).
#: ``base`` is the connector-facing API at the top of txsink/; the faces are what users
#: build and run (the package, the Coordinator, the drop-in sink, the Data Source, the
#: runner); ``testing`` and ``cli`` stand above them all. docs/architecture.md draws it.
ROOMS: dict[str, set[str]] = {
    "base": {"base"},
    "kit": {"base", "kit"},
    "observe": {"base", "kit", "observe"},
    "protocol": {"base", "kit", "observe", "protocol"},
    "spark": {"base", "kit", "observe", "protocol", "spark"},
    "ops": {"base", "kit", "observe", "protocol", "spark", "ops"},
    "face": {"base", "kit", "observe", "protocol", "spark", "ops", "face"},
    "testing": {"base", "kit", "observe", "protocol", "spark", "ops", "face", "testing"},
    "cli": {"base", "kit", "observe", "protocol", "spark", "ops", "face", "testing", "cli"},
}
#: The base API: top-level modules that import only each other.
BASE = {
    "txsink.contract", "txsink.errors", "txsink.handles", "txsink.txid", "txsink.rowref",
    "txsink.registry", "txsink.store", "txsink.metrics", "txsink.schema", "txsink._version",
    "txsink.audit", "txsink.audit.digest", "txsink.audit.found", "txsink.audit.canonical",
    "txsink.audit.kernels",
}  # fmt: skip
#: The faces: top-level modules (and the Data Source package) that may import any room.
FACES = {"txsink", "txsink.coordinator", "txsink.sink", "txsink.runner", "txsink._moved"}
#: What a connector's own modules may import: the base, the kit, observe (logging), the
#: package's face and the sink base class, and the testing toolkit.
CONNECTOR_MAY = {"base", "kit", "observe", "testing", "txsink", "txsink.sink"}
#: ... and what the modules it registers for the toolkit and the CLI (its testing adapter,
#: its commands: ``registry.Connector.testing`` / ``.commands``) may import besides.
CONNECTOR_TOOLS_MAY = CONNECTOR_MAY | {"cli", "txsink.runner"}
#: Rooms whose modules must not import these top-level packages, at any depth of the file.
FORBIDDEN = {"protocol": ("pyspark", "py4j")}
MAX_MODULES = 15
#: Folders over MAX_MODULES for now, each with the issue that splits it (none today).
CROWDED: dict[str, str] = {}


def room_of(module: str) -> str | None:
    """The room of a module of txsink/ (``None``: a connector)."""
    if module.startswith("txsink.connectors"):
        return None
    if module in BASE:
        return "base"
    if module in FACES or module == "txsink.datasource" or module.startswith("txsink.datasource."):
        return "face"
    part = module.split(".")[1]
    if part in ROOMS and part not in ("base", "face"):
        return part
    raise AssertionError(f"{module}: in no room; add it to ROOMS/BASE/FACES in this test")


def _core_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _modules(CORE)}


def _all_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in [*_modules(CORE), *_modules(CONNECTORS)]}


def _arrows(path: Path, name: str, modules: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import of a txsink module in the file, at any
    depth (functions, ``TYPE_CHECKING``), resolved to the module that defines it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.ImportFrom) and node.module is not None) or (
            isinstance(node, ast.ImportFrom) and node.level
        ):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            targets = [f"{base}.{a.name}" for a in node.names]
            # ``from txsink import errors`` names a module; ``from txsink import Coordinator``
            # names the package's face.
            found = [t for t in targets if t in modules] or [base]
        elif isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        else:
            continue
        for imported in found:
            resolved = imported
            while resolved and resolved not in modules:
                resolved = resolved.rpartition(".")[0]
            if resolved and resolved != name and imported.startswith("txsink"):
                yield node.lineno, resolved


def _top_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every import in the file, at any depth."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module.split(".")[0]
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name.split(".")[0]) for a in node.names)


def room_violations(modules: dict[str, Path]) -> list[str]:
    found = []
    for name, path in modules.items():
        room = room_of(name)
        if room is None:
            continue
        for line, imported in _arrows(path, name, modules):
            other = room_of(imported)
            if other is not None and other not in ROOMS[room]:
                found.append(
                    f"{path.relative_to(ROOT)}:{line}: {room} imports {other} ({imported})"
                )
        for line, top in _top_imports(path):
            if top in FORBIDDEN.get(room, ()):
                found.append(f"{path.relative_to(ROOT)}:{line}: {room} imports {top}")
    return found


def test_imports_run_one_way_between_the_rooms() -> None:
    """Every import in txsink/ (lazy and ``TYPE_CHECKING`` ones too: a lazy import is an
    arrow all the same) goes to its own room or one below; the protocol never imports
    Spark."""
    found = room_violations(_core_modules())
    assert not found, "imports against the rooms' order (docs/architecture.md):\n" + "\n".join(
        found
    )


def _tool_modules() -> set[str]:
    """The modules connectors register for the testing toolkit and the CLI."""
    refs = []
    for record in registry.connectors().values():
        refs += [record.testing or "", *record.commands.values()]
    return {ref.partition(":")[0] for ref in refs if ref}


def connector_violations(modules: dict[str, Path], tools: set[str]) -> list[str]:
    found = []
    for name, path in modules.items():
        if not name.startswith("txsink.connectors."):
            continue
        may = CONNECTOR_TOOLS_MAY if name in tools else CONNECTOR_MAY
        for line, imported in _arrows(path, name, modules):
            if imported.startswith("txsink.connectors"):
                continue
            if imported not in may and room_of(imported) not in may:
                where = f"{path.relative_to(ROOT)}:{line}"
                found.append(f"{where}: imports {imported} ({room_of(imported)})")
    return found


def test_connectors_import_only_the_api_the_kit_and_the_toolkit() -> None:
    """A connector builds on the base API, the kit, logging, the face and the sink base
    class (and its testing adapter and commands on the toolkit and the CLI): never on the
    protocol, Spark or the operator tools, which reach it through its hooks."""
    found = connector_violations(_all_modules(), _tool_modules())
    assert not found, "connectors importing the core's rooms:\n" + "\n".join(found)


def crowded_folders(root: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for folder in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if folder.name == "__pycache__" or folder.is_symlink():
            continue
        n = sum(1 for _ in folder.glob("*.py"))  # the package's __init__ counts too
        rel = str(folder.relative_to(ROOT))
        if n > MAX_MODULES and rel not in CROWDED:
            counts[rel] = n
    return counts


def test_no_folder_of_the_core_is_crowded() -> None:
    """At most 15 modules a folder, its ``__init__.py`` included: a folder that grows past
    it is a room to split."""
    big = crowded_folders(CORE)
    assert not big, f"folders over {MAX_MODULES} modules (split them into rooms): {big}"


def test_every_room_states_its_job() -> None:
    """Each sub-package's docstring says its job and what it may import."""
    for init in sorted(CORE.glob("*/__init__.py")):
        if init.parent.is_symlink():
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert doc, f"{init.relative_to(ROOT)}: no docstring stating the room's job"
        if init.parent.name in ROOMS:
            assert "May import" in doc, f"{init.relative_to(ROOT)}: say what it may import"


#: The Kafka connector's modes: sub-packages of connectors/kafka/ (connectors/kafka/__init__.py).
KAFKA = CONNECTORS / "kafka"
KAFKA_MODES = ("direct", "replay", "wal")
#: The modules that may pick a mode: the sink, the package's face, the testing adapter.
KAFKA_PICKERS = ("sink", "__init__", "testing")


def test_the_kafka_modes_import_only_the_shared_parts() -> None:
    """A Kafka mode (``direct/``, ``replay/``, ``wal/``) never imports another mode: what two
    modes share lives in the shared parts (``records/``, ``clients/``, ``fromreplay``...).
    The shared parts import no mode either: only the sink picks one (and the package face
    and the testing adapter name them). ``clients/``, the bottom room, imports nothing
    else of the connector."""
    base = "txsink.connectors.kafka."
    found = set()
    for path in _modules(KAFKA):
        rel = path.relative_to(KAFKA)
        mine = rel.parts[0] if len(rel.parts) > 1 and rel.parts[0] in KAFKA_MODES else None
        if mine is None and len(rel.parts) == 1 and path.stem in KAFKA_PICKERS:
            continue
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for imported in _imports(path, package):
            room = imported.removeprefix(base).split(".")[0] if imported.startswith(base) else ""
            if room in KAFKA_MODES and room != mine:
                found.add(f"{rel} ({mine or 'shared'}) imports the {room} mode")
            elif rel.parts[0] == "clients" and room and room != "clients":
                found.add(f"{rel} (clients/, the bottom room) imports {base}{room}")
    assert not found, "the Kafka modes import only the shared parts:\n" + "\n".join(sorted(found))


def test_only_the_testing_face_imports_the_chaos_runs() -> None:
    """``txsink/testing/chaos/`` (the chaos runs) builds on the modules beside it; of those,
    only the package face and the pytest plugin import it, so the connector kit and the
    documented tools never depend on the chaos runs."""
    testing = CORE / "testing"
    room = "txsink.testing.chaos"
    found = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules(testing)
        if not path.is_relative_to(testing / "chaos")
        and path.name not in ("__init__.py", "pytest_plugin.py")
        for name in _imports(path, "txsink.testing")
        if name == room or name.startswith(room + ".")
    ]
    assert not found, found
