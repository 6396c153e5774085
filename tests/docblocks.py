"""Docs that run: extract the code blocks of README.md and docs/, run them, compare outputs.

The convention (docs/testing.md, "Docs that run"):

- Every ```python, ```bash (``sh``, ``shell``) and ```console block runs, in page order, in
  one fresh working directory per page. Other blocks (``text``, ``json``, no language) are
  never run.
- HTML comments on the lines right above a block's opening fence mark it:
  ``<!-- not run: why -->`` (never run; the reason is required),
  ``<!-- needs: postgres kafka -->`` (test services, or ``slow``: only with ``--run-slow``),
  ``<!-- cwd: repo -->`` (run in the repository root, e.g. ``./dev``),
  ``<!-- output -->`` (this block is what the runnable block right before it prints).
- Python blocks of a page share one interpreter (a child process, :mod:`tests.docsession`);
  a python block whose first line is ``# some/file.py`` is written to that file (and
  compiled) instead. Bash blocks run with ``bash -e``; a console block runs each ``$ ``
  line and compares what it prints with the lines under it.
- In an expected output, ``...`` stands for any text within a line, and a line that is
  only ``...`` for any number of lines.

A page runs from ``tests/`` (``tests/test_docs.py``) unless a block needs a server; then it
runs from ``integration/`` (``integration/test_docs_servers.py``) with those markers.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
#: The pages whose blocks are run.
PATTERNS = ("README.md", "docs/*.md", "docs/connectors/*.md", "docs/examples/**/README.md")
#: What ``needs:`` may name: the integration suite's service markers, and ``slow``.
SERVICES = frozenset({"postgres", "kafka", "s3", "registry"})
KNOWN_NEEDS = SERVICES | {"slow"}
LANGS = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
LANGS["console"] = "console"
BLOCK_TIMEOUT = 900.0

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
        else:
            raise DocsError(
                f"{where}: unknown marker <!-- {m['text']} -->: use 'not run: why', "
                "'needs: ...', 'cwd: repo' or 'output'"
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


# -- running ------------------------------------------------------------------------------


@dataclass
class Outcome:
    block: Block
    status: str  # passed | failed | skipped | not reached
    detail: str = ""
    seconds: float = 0.0


def venv_bin() -> Path:
    """The running interpreter's bin folder (the repo's venv under ./dev and the suite)."""
    return Path(sys.executable).parent


def docs_env(
    extra: Mapping[str, str] = {}, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a page: the venv first on PATH (as if activated), unbuffered output,
    no inherited fault plan, ``extra`` (the services' ``TXSINK_*``) and, where the suite
    built one, Spark's class-data-sharing archive for every driver (~5 s less per start)."""
    env = {k: v for k, v in (os.environ if base is None else base).items()}
    for key in ("TXSINK_FAULT", "TXSINK_FAULT_STATE", "PYSPARK_SUBMIT_ARGS"):
        env.pop(key, None)
    env["PATH"] = f"{venv_bin()}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv_bin().parent)
    env["PYTHONUNBUFFERED"] = "1"
    from txsink._jvmcds import java_options

    if cds := java_options():
        opts = f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC {cds}"
        env["PYSPARK_SUBMIT_ARGS"] = f"--driver-java-options '{opts}' pyspark-shell"
    env.update(extra)
    return env


def _stop(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_shell(command: str, cwd: Path, env: Mapping[str, str], timeout: float) -> tuple[int, str]:
    """``bash -e -c command``: exit code and stdout+stderr as one text."""
    proc = subprocess.Popen(
        ["bash", "-e", "-c", command],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        return -1, f"timed out after {timeout:.0f} s"
    return proc.returncode, out


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


@dataclass
class PythonSession:
    """One interpreter per page (:mod:`tests.docsession`); started on the first python block."""

    cwd: Path
    env: Mapping[str, str]
    log: Path
    proc: subprocess.Popen[str] | None = None
    answers: IO[str] | None = field(default=None, repr=False)

    def run(self, block: Block, timeout: float) -> tuple[str | None, str]:
        """Run a block: (the error, or None; what it printed on stdout)."""
        if self.proc is None:
            read, write = os.pipe()
            with self.log.open("a") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, str(Path(__file__).with_name("docsession.py")), str(write)],
                    cwd=self.cwd,
                    env=dict(self.env),
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    text=True,
                    pass_fds=(write,),
                    start_new_session=True,
                )
            os.close(write)
            self.answers = os.fdopen(read)
        assert self.proc.stdin is not None and self.answers is not None
        request = {"code": "\n" * block.line + block.text, "file": block.page}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.answers], [], [], timeout)
        line = self.answers.readline() if ready else ""
        if not line:
            _stop(self.proc)
            self.close()
            why = "timed out" if not ready else "the interpreter died"
            return f"{why} (after {timeout:.0f} s at most); see {self.log}", ""
        answer = json.loads(line)
        return answer["error"], answer["stdout"]

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.stdin:
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=60)
        _stop(self.proc)
        if self.answers:
            self.answers.close()
        self.proc = None


def _tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def _run_block(
    block: Block, cwd: Path, env: Mapping[str, str], session: PythonSession, timeout: float
) -> str | None:
    """The failure of one block, or None."""
    if block.kind == "python" and (path := block.file):
        target = cwd / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text + "\n")
        try:
            compile(block.text, str(target), "exec")
        except SyntaxError as exc:
            return f"{path} does not compile: {exc}"
        return None
    if block.kind == "python":
        error, out = session.run(block, timeout)
        if error:
            return f"{error}\nstdout:\n{out}\nthe interpreter's log (tail):\n{_tail(session.log)}"
        steps = [("", out)]
    elif block.kind == "bash":
        code, out = run_shell(block.text, cwd, env, timeout)
        if code:
            return f"exit code {code}; output:\n{out}"
        steps = [("", out)]
    else:
        for command, shown in console_steps(block.text):
            code, out = run_shell(command, cwd, env, timeout)
            if code:
                return f"$ {command}\nexit code {code}; output:\n{out}"
            if shown.strip() and not matches(shown, out):
                return f"$ {command}\nthe output differs:\n{mismatch(shown, out)}"
        return None
    if block.expected is not None and not matches(block.expected, steps[0][1]):
        return f"the output differs:\n{mismatch(block.expected, steps[0][1])}"
    return None


@contextlib.contextmanager
def _repo_lock() -> Iterator[None]:
    """One ``cwd: repo`` block at a time per checkout (``./dev demo`` empties .txsink-demo/)."""
    key = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir(), f"txsink-docs-{key}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run_page(
    page: Page,
    workdir: Path,
    env: Mapping[str, str],
    *,
    slow: bool = False,
    timeout: float = BLOCK_TIMEOUT,
) -> list[Outcome]:
    """Run a page's blocks in order in ``workdir/work``; stop at the first failure."""
    cwd = workdir / "work"
    cwd.mkdir(parents=True, exist_ok=True)
    session = PythonSession(cwd, env, workdir / "python-session.log")
    outcomes: list[Outcome] = []
    failed = False
    try:
        for block in page.blocks:
            if failed:
                outcomes.append(Outcome(block, "not reached"))
                continue
            if block.skip is not None:
                outcomes.append(Outcome(block, "skipped", f"not run: {block.skip}"))
                continue
            if "slow" in block.needs and not slow:
                outcomes.append(Outcome(block, "skipped", "slow: run with --run-slow"))
                continue
            started = time.monotonic()
            with _repo_lock() if block.in_repo else contextlib.nullcontext():
                where = ROOT if block.in_repo else cwd
                error = _run_block(block, where, env, session, timeout)
            failed = error is not None
            status = "failed" if failed else "passed"
            outcomes.append(Outcome(block, status, error or "", time.monotonic() - started))
    finally:
        session.close()
    return outcomes


def summary(outcomes: list[Outcome]) -> str:
    """One line per block: status, seconds, where, and the reason or failure."""
    lines = []
    for o in outcomes:
        head = f"{o.status:11} {o.seconds:6.1f} s  {o.block.name} ({o.block.kind})"
        detail = o.detail if o.status == "failed" else o.detail.split("\n", 1)[0]
        lines.append(f"{head}  {detail}".rstrip())
    return "\n".join(lines)


def check_page(
    page: Page, workdir: Path, env: Mapping[str, str], *, slow: bool = False
) -> list[Outcome]:
    """Run a page and raise AssertionError with the summary if a block failed."""
    outcomes = run_page(page, workdir, env, slow=slow)
    report = summary(outcomes)
    print(report)
    if any(o.status == "failed" for o in outcomes):
        raise AssertionError(f"{page.path}: a block failed\n{report}")
    return outcomes


def main(argv: list[str]) -> int:
    """``python -m tests.docblocks [--slow] [PAGE ...]``: run pages by hand (servers from the
    environment: ``set -a; . integration/.services.env; set +a``)."""
    slow = "--slow" in argv
    wanted = [a for a in argv if not a.startswith("--")]
    failed = 0
    for page in pages():
        if wanted and page.path not in wanted:
            continue
        with tempfile.TemporaryDirectory(prefix="txsink-docs-") as tmp:
            started = time.monotonic()
            outcomes = run_page(page, Path(tmp), docs_env(), slow=slow)
            print(f"== {page.path}: {time.monotonic() - started:.1f} s", flush=True)
            print(summary(outcomes), flush=True)
            failed += any(o.status == "failed" for o in outcomes)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
