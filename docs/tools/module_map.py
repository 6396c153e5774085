"""Print the module map of docs/architecture.md: every module of txsink/ and connectors/,
its lines and its first docstring line. Run from the repository root:

    python docs/tools/module_map.py > /tmp/map.md     # print it
    python docs/tools/module_map.py --write           # replace it in docs/architecture.md

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
    ("txsink/kit/", "plumbing shared by the core and the connectors"),
    ("txsink/observe/", "logging, failures, metering, exporters"),
    ("txsink/protocol/", "the protocol, without Spark"),
    ("txsink/spark/", "everything that touches Spark"),
    ("txsink/ops/", "operator tools over a log"),
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


def write() -> None:
    """Replace the map (the last section of docs/architecture.md, after its intro)."""
    doc = ROOT / "docs" / "architecture.md"
    text = doc.read_text()
    start = text.index("## Module map")
    first = text.index("\n**`", start)
    doc.write_text(text[: first + 1] + "\n".join(rows()).lstrip() + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write("\n".join(rows()).lstrip() + "\n")
