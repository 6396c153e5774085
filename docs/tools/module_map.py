"""Print the module map of docs/architecture.md: every module of txsink/ and connectors/,
its lines and its first docstring line. Run from the repository root:

    python docs/tools/module_map.py > /tmp/map.md     # print it
    python docs/tools/module_map.py --arrows          # the imports between the rooms
    python docs/tools/module_map.py --write           # replace both in docs/architecture.md

tests/test_structure.py checks that the map in docs/architecture.md names every module.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONNECTORS = sorted(
    p.name for p in (ROOT / "connectors").iterdir() if p.is_dir() and not p.name.startswith("_")
)


def _connector_groups(name: str) -> list[tuple[str, str]]:
    """A connector's folder, then each of its sub-packages (``connectors/kafka/wal/``),
    named by the first line of the sub-package's docstring."""
    groups = [(f"connectors/{name}/", f"the {name} connector")]
    for sub in sorted((ROOT / "connectors" / name).iterdir()):
        if (sub / "__init__.py").is_file():
            doc = ast.get_docstring(ast.parse((sub / "__init__.py").read_text())) or sub.name
            what = doc.split(":")[0].split("\n")[0].rstrip(".")
            if what[1:2].islower():  # "WAL mode" keeps its capitals
                what = what[:1].lower() + what[1:]
            groups.append((f"connectors/{name}/{sub.name}/", what))
    return groups


GROUPS = [
    ("txsink/", "the core's public surface: the base API and the faces"),
    ("txsink/audit/", "the base API's audit evidence: the row digest, the hook's types"),
    ("txsink/kit/", "plumbing shared by the core and the connectors"),
    ("txsink/observe/", "logging, failures, metering, exporters"),
    ("txsink/protocol/", "the protocol, without Spark"),
    ("txsink/spark/", "everything that touches Spark"),
    ("txsink/ops/", "operator tools over a log"),
    ("txsink/ops/audit/", "txsink audit: the log's promise against the targets"),
    ("txsink/datasource/", "the Data Source face"),
    ("txsink/cli/", "the command line"),
    ("txsink/testing/", "the testing toolkit"),
    ("txsink/testing/chaos/", "the chaos runs"),
    ("connectors/", "the connectors' namespace package"),
    *[group for name in CONNECTORS for group in _connector_groups(name)],
]


def summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    return first.replace("|", "\\|")


def rows() -> list[str]:
    out = []
    for folder, what in GROUPS:
        files = sorted(p for p in (ROOT / folder).glob("*.py"))
        if not files:
            continue
        total = sum(len(p.read_text().splitlines()) for p in files)
        out.append(f"\n**`{folder}`** ({what}, {total} lines)\n")
        out.append("| module | lines | job |")
        out.append("|---|---:|---|")
        for p in files:
            lines = len(p.read_text().splitlines())
            out.append(f"| `{p.name}` | {lines} | {summary(p)} |")
    return out


#: The rooms of txsink/ in their order, bottom to top (docs/architecture.md, "The rooms").
ORDER = ["base", "kit", "observe", "protocol", "spark", "ops", "faces", "testing", "cli"]
ARROWS_START, ARROWS_END = "<!-- arrows: start -->", "<!-- arrows: end -->"


def _imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The txsink modules a file imports, at any depth (functions, TYPE_CHECKING):
    ``from txsink import registry`` names the module ``txsink.registry``, not the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            subs = {f"{base}.{a.name}" for a in node.names}
            found.update(subs & modules.keys() or {base})
            found.update({base} if subs - modules.keys() else set())
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m == "txsink" or m.startswith("txsink.")}


def _core() -> dict[str, Path]:
    core = ROOT / "txsink"
    out = {}
    for path in sorted(core.rglob("*.py")):
        if "connectors" in path.relative_to(core).parts or "__pycache__" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def arrows() -> list[str]:
    """How many imports run from each room of txsink/ to each other, measured from the code
    (a top-level module is a face when it imports a room, else the base API)."""
    modules = _core()
    rooms = {f"txsink.{r}" for r in ORDER}

    def room(module: str) -> str:
        parts = module.split(".")
        if len(parts) > 1 and f"txsink.{parts[1]}" in rooms:
            return parts[1]
        if len(parts) > 1 and parts[1] == "datasource":
            return "faces"
        return "top"

    imports = {
        name: {m for m in _imported(path, name, modules) if m in modules}
        for name, path in modules.items()
    }
    top = {n for n in modules if room(n) == "top"}
    faces = {n for n in top if n == "txsink" or any(room(m) != "top" for m in imports[n])}

    def of(module: str) -> str:
        r = room(module)
        return ("faces" if module in faces else "base") if r == "top" else r

    counts: dict[tuple[str, str], int] = {}
    for name, targets in imports.items():
        for target in targets - {name}:
            pair = (of(name), of(target))
            if pair[0] != pair[1]:
                counts[pair] = counts.get(pair, 0) + 1
    out = ["| from \\ to | " + " | ".join(ORDER) + " |", "|---|" + "---:|" * len(ORDER)]
    for src in ORDER:
        cells = [str(counts.get((src, dst), "")) or ("·" if src != dst else "") for dst in ORDER]
        out.append(f"| **{src}** | " + " | ".join(cells) + " |")
    return out


def write() -> None:
    """Replace the arrows table and the map (the last section of docs/architecture.md)."""
    doc = ROOT / "docs" / "architecture.md"
    text = doc.read_text()
    a, b = text.index(ARROWS_START) + len(ARROWS_START), text.index(ARROWS_END)
    text = text[:a] + "\n" + "\n".join(arrows()) + "\n" + text[b:]
    start = text.index("## Module map")
    first = text.index("\n**`", start)
    doc.write_text(text[: first + 1] + "\n".join(rows()).lstrip() + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    elif sys.argv[1:] == ["--arrows"]:
        sys.stdout.write("\n".join(arrows()) + "\n")
    else:
        sys.stdout.write("\n".join(rows()).lstrip() + "\n")
