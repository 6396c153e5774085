"""Docs that run: extract the code blocks of README.md and docs/, run them, compare outputs.

The convention (docs/testing.md, "Docs that run"):

- Every ```python, ```bash (``sh``, ``shell``) and ```console block runs, in page order, in
  one fresh working directory per page. Other blocks (``text``, ``json``, no language) are
  never run.
- HTML comments on the lines right above a block's opening fence mark it:
  ``<!-- not run: why -->`` (never run; the reason is required),
  ``<!-- needs: postgres kafka -->`` (test services, or ``slow``: only with ``--run-slow``),
  ``<!-- cwd: repo -->`` (run in the repository root, e.g. ``./dev``),
  ``<!-- output -->`` (this block is what the runnable block right before it prints),
  ``<!-- setup -->`` (later blocks rely on this one: a block run alone runs after the
  page's setup blocks above it, :mod:`tests.docnames`).
- Python blocks of a page share one interpreter (a child process, :mod:`tests.docsession`);
  a python block whose first line is ``# some/file.py`` is written to that file (and
  compiled) instead. Bash blocks run with ``bash -e``; a console block runs each ``$ ``
  line and compares what it prints with the lines under it.
- In an expected output, ``...`` stands for any text within a line, and a line that is
  only ``...`` for any number of lines.

A page runs from ``tests/`` (``tests/test_docs.py``) unless a block needs a server; then it
runs from ``integration/`` (``integration/test_docs_servers.py``) with those markers. This
module reads the pages and compares outputs; :mod:`tests.docrun` runs them.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The pages whose blocks are run.
PATTERNS = ("README.md", "docs/*.md", "docs/connectors/*.md", "docs/examples/**/README.md")
#: What ``needs:`` may name: the integration suite's service markers, and ``slow``.
SERVICES = frozenset({"postgres", "kafka", "s3", "registry"})
KNOWN_NEEDS = SERVICES | {"slow"}
LANGS = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
LANGS["console"] = "console"

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})\s*(?P<lang>[\w+-]*)")
_COMMENT = re.compile(r"^\s*<!--\s*(?P<text>.*?)\s*-->\s*$")
_FILE = re.compile(r"#\s*(?P<path>[\w./-]+\.py)\s*$")


class DocsError(ValueError):
    """A page breaks the convention (an unknown marker, an output block without a block)."""


@dataclass(frozen=True)
class Block:
    """One runnable block of a page, with its markers and the output the page shows for it."""

    page: str
    line: int  # the opening fence, 1-based
    kind: str  # python | bash | console
    text: str
    skip: str | None = None
    needs: frozenset[str] = frozenset()
    in_repo: bool = False
    expected: str | None = None
    setup: bool = False

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def file(self) -> str | None:
        """``# path.py`` on a python block's first line: the block is that file."""
        first = self.text.split("\n", 1)[0]
        found = _FILE.fullmatch(first) if self.kind == "python" else None
        return found["path"] if found else None


@dataclass(frozen=True)
class Page:
    path: str
    blocks: tuple[Block, ...]

    @property
    def needs(self) -> frozenset[str]:
        return frozenset().union(*(b.needs for b in self.blocks if b.skip is None))

    @property
    def services(self) -> frozenset[str]:
        return self.needs & SERVICES

    def __str__(self) -> str:
        return self.path


def _markers(lines: list[str], fence: int, where: str) -> dict[str, str]:
    found: dict[str, str] = {}
    i = fence - 1
    while i >= 0 and (m := _COMMENT.match(lines[i])):
        key, _, value = m["text"].partition(":")
        key, value = key.strip(), value.strip()
        if key == "not run" and value:
            found["skip"] = value
        elif key == "needs" and value:
            unknown = set(value.split()) - KNOWN_NEEDS
            if unknown:
                raise DocsError(
                    f"{where}: unknown needs {sorted(unknown)}: use {sorted(KNOWN_NEEDS)}"
                )
            found["needs"] = value
        elif key == "cwd" and value == "repo":
            found["cwd"] = value
        elif key == "output" and not value:
            found["output"] = ""
        elif key == "setup" and not value:
            found["setup"] = ""
        else:
            raise DocsError(
                f"{where}: unknown marker <!-- {m['text']} -->: use 'not run: why', "
                "'needs: ...', 'cwd: repo', 'output' or 'setup'"
            )
        i -= 1
    return found


def parse(text: str, page: str) -> Page:
    """The runnable blocks of one Markdown page."""
    lines = text.split("\n")
    blocks: list[Block] = []
    previous: Block | None = None  # the fenced block right before, if runnable
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, start = len(m["indent"]), m["fence"], i
        where = f"{page}:{start + 1}"
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            line = lines[i]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            i += 1
        if i == len(lines):
            raise DocsError(f"{where}: the block is not closed")
        i += 1
        marks = _markers(lines, start, where)
        content = "\n".join(body)
        if "output" in marks:
            if previous is None or previous.kind == "console" or previous.file:
                raise DocsError(f"{where}: an output block must follow a python or bash block")
            if len(marks) > 1:
                raise DocsError(f"{where}: an output block takes no other marker")
            blocks[-1] = replace(previous, expected=content)
            previous = None
            continue
        kind = LANGS.get(m["lang"].lower())
        if kind is None:
            if set(marks) - {"skip"}:
                raise DocsError(f"{where}: markers on a block that never runs ({m['lang']!r})")
            previous = None
            continue
        if kind == "console" and not any(line.startswith("$ ") for line in body):
            raise DocsError(f"{where}: a console block needs '$ ' command lines")
        previous = Block(
            page=page,
            line=start + 1,
            kind=kind,
            text=content,
            skip=marks.get("skip"),
            needs=frozenset(marks.get("needs", "").split()),
            in_repo="cwd" in marks,
            setup="setup" in marks,
        )
        blocks.append(previous)
    return Page(page, tuple(blocks))


def pages(root: Path = ROOT) -> list[Page]:
    """Every page of :data:`PATTERNS` that has a runnable block, by path."""
    paths = sorted({p for pattern in PATTERNS for p in root.glob(pattern)})
    found = [parse(p.read_text(), str(p.relative_to(root))) for p in paths]
    return [p for p in found if p.blocks]


def pages_to_run(*, servers: bool, root: Path = ROOT) -> list[Page]:
    """The pages with a block to run: those that need servers (integration/), or the others."""
    return [
        p
        for p in pages(root)
        if any(b.skip is None for b in p.blocks) and bool(p.services) == servers
    ]


def run_slow(config: Any) -> bool:
    """The suite's ``--run-slow`` (or ``TXSINK_SLOW=1``): also the blocks that need ``slow``."""
    return bool(config.getoption("--run-slow")) or os.environ.get("TXSINK_SLOW") == "1"


# -- comparing outputs --------------------------------------------------------------------


def _clean(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def pattern(expected: str) -> re.Pattern[str]:
    """``...`` is any text within a line; a line of only ``...``, any number of lines."""
    parts = []
    for line in _clean(expected):
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append("[^\n]*?".join(re.escape(p) for p in line.split("...")) + "\n")
    return re.compile("".join(parts))


def matches(expected: str, actual: str) -> bool:
    return pattern(expected).fullmatch("".join(f"{line}\n" for line in _clean(actual))) is not None


def mismatch(expected: str, actual: str) -> str:
    diff = difflib.unified_diff(
        _clean(expected), _clean(actual), "the page", "the run", lineterm=""
    )
    return "\n".join(diff)


def console_steps(text: str) -> list[tuple[str, str]]:
    """A console block as (command, the output shown under it) pairs."""
    steps: list[tuple[str, list[str]]] = []
    lines = iter(text.split("\n"))
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + "\n" + next(lines, "")
            steps.append((command, []))
        elif steps:
            steps[-1][1].append(line)
    return [(c, "\n".join(out)) for c, out in steps]
