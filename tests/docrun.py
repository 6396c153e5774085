"""Run a page's blocks (the convention is in :mod:`tests.docblocks` and docs/testing.md).

``python -m tests.docrun [--slow] [PAGE ...]`` runs pages by hand, servers from the
environment.
"""

from __future__ import annotations

import contextlib
import fcntl
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.docblocks import ROOT, Block, Page, console_steps, matches, mismatch, pages

BLOCK_TIMEOUT = 900.0
#: A python block that starts a streaming query writing through txsink ...
_STARTS_TXSINK_QUERY = re.compile(
    r"(\.foreachBatch\(|\.format\(\s*[\"']txsink[\"']\s*\))(?s:.*)\.start\(\)"
)
#: ... logs at least one line for an epoch (committed, skipped, aborted, recovered): a query
#: over an empty stream runs no batch and logs none, and that is the silent run to catch.
_EPOCH_LINE = re.compile(r"epoch[ =]\d+\]")


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
    from txsink.spark.jvmcds import java_options

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


@dataclass
class PythonSession:
    """One interpreter per page (:mod:`tests.docsession`); started on the first python block."""

    cwd: Path
    env: Mapping[str, str]
    log: Path
    proc: subprocess.Popen[str] | None = None
    answers: IO[str] | None = field(default=None, repr=False)
    logged: str = ""  # what the last block wrote to the log: its stdout, stderr, Spark's lines

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
        start = self.log.stat().st_size if self.log.exists() else 0
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
        with self.log.open("rb") as log:
            log.seek(start)
            self.logged = log.read().decode(errors="replace")
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
        if _STARTS_TXSINK_QUERY.search(block.text) and not _EPOCH_LINE.search(session.logged):
            return (
                "the block starts a query that writes through txsink, and txsink logged no "
                "epoch: the query ran no batch (an empty input, or a name an earlier block "
                f"rebound?); what the block logged:\n{session.logged[-3000:]}"
            )
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
    """One ``cwd: repo`` block at a time per checkout (``./dev demo`` empties .txsink-demo/).
    The lock lives in the checkout: each test session has a temporary folder of its own."""
    with open(ROOT / ".txsink-docs.lock", "w") as lock:
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


def runs(block: Block, *, slow: bool) -> bool:
    """Whether this run runs the block (not ``not run``, and ``slow`` only with --run-slow)."""
    return block.skip is None and (slow or "slow" not in block.needs)


def alone(page: Page, *, slow: bool = False) -> list[Page]:
    """The page as a reader who pastes one block pastes it: each block after the page's setup
    blocks above it (``<!-- setup -->``), one small page per block. The setup blocks run
    together once (each one alone is a prefix of that run)."""
    setup = [b for b in page.blocks if b.setup and runs(b, slow=slow)]
    found = [Page(page.path, tuple(setup))] if setup else []
    for block in page.blocks:
        if runs(block, slow=slow) and not block.setup:
            above = tuple(b for b in setup if b.line < block.line)
            found.append(Page(page.path, (*above, block)))
    return found


def check_blocks_alone(
    page: Page, workdir: Path, env: Mapping[str, str], *, slow: bool = False
) -> None:
    """Run every block alone (:func:`alone`), each in a fresh folder and interpreter; raise
    AssertionError naming every block that fails so."""
    failures = []
    for i, part in enumerate(alone(page, slow=slow)):
        last = part.blocks[-1]
        outcomes = run_page(part, workdir / f"alone-{i}-{last.line}", env, slow=slow)
        report = summary(outcomes)
        what = "the setup blocks together" if last.setup else f"{last.name} alone"
        print(f"-- {what}:\n{report}")
        if any(o.status == "failed" for o in outcomes):
            where = "" if last.setup else ", run after the page's setup above it"
            failures.append(f"{what}{where}:\n{report}")
    if failures:
        raise AssertionError(f"{page.path}: blocks fail alone\n" + "\n".join(failures))


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
    """``python -m tests.docrun [--slow] [--alone] [PAGE ...]``: run pages by hand (servers
    from the environment: ``set -a; . integration/.services.env; set +a``); ``--alone``
    runs each block alone after the page's setup too."""
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
            if "--alone" in argv:
                started = time.monotonic()
                try:
                    check_blocks_alone(page, Path(tmp), docs_env(), slow=slow)
                except AssertionError:
                    failed += 1
                print(f"== {page.path} alone: {time.monotonic() - started:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
