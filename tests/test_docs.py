"""Docs that run (docs/testing.md): every page's blocks that need no server, and the harness.

The pages that need a server run from ``integration/test_docs_servers.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import docblocks, docnames, docrun
from tests.docblocks import Block, DocsError, matches, parse
from tests.docrun import run_page

# Starts Spark drivers in child processes: the session builds the CDS archive first.
pytestmark = pytest.mark.spark

FENCE = "```"


def md(text: str) -> str:
    """Markdown written with ~~~ for fences (no backticks inside this file's strings)."""
    return text.replace("~~~", FENCE)


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("page", docblocks.pages_to_run(servers=False), ids=str)
def test_page_runs_as_written(
    page: docblocks.Page, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    docrun.check_page(page, tmp_path, docrun.docs_env(), slow=docblocks.run_slow(request.config))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("page", docblocks.pages_to_run(servers=False), ids=str)
def test_each_block_runs_alone_after_the_page_setup(
    page: docblocks.Page, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    docrun.check_blocks_alone(
        page, tmp_path, docrun.docs_env(), slow=docblocks.run_slow(request.config)
    )


# -- the pages ----------------------------------------------------------------------------


@pytest.mark.parametrize("page", docblocks.pages(), ids=str)
def test_no_block_rebinds_a_name_a_later_block_uses(page: docblocks.Page) -> None:
    assert not docnames.rebinding_problems(page)


@pytest.mark.parametrize("page", docblocks.pages(), ids=str)
def test_every_block_has_its_names_from_the_page_setup(page: docblocks.Page) -> None:
    assert not docnames.alone_problems(page)


def test_every_page_parses_and_the_server_pages_say_so() -> None:
    found = {p.path: p for p in docblocks.pages()}
    assert {"README.md", "docs/quickstart.md", "docs/connectors/postgres.md"} <= set(found)
    assert found["docs/connectors/postgres.md"].services == {"postgres"}
    assert found["docs/connectors/kafka.md"].services == {"kafka", "registry", "s3"}
    assert not found["docs/quickstart.md"].services
    local = {p.path for p in docblocks.pages_to_run(servers=False)}
    remote = {p.path for p in docblocks.pages_to_run(servers=True)}
    assert "docs/quickstart.md" in local and "docs/connectors/s3.md" in remote
    assert not local & remote


def test_every_page_of_the_patterns_is_read() -> None:
    root = docblocks.ROOT
    on_disk = {str(p.relative_to(root)) for p in root.glob("docs/**/*.md")} | {"README.md"}
    read = {p.path for p in docblocks.pages()}
    skipped = {p for p in on_disk - read if "```python" in (root / p).read_text()}
    assert not skipped, f"pages with python blocks that the docs test does not read: {skipped}"


# -- parsing ------------------------------------------------------------------------------

PAGE = md("""
# A page

~~~python
x = 1
~~~

<!-- output -->
~~~text
one
~~~

<!-- not run: a signature -->
~~~python
f(a, *, b)
~~~

- a list item

  <!-- needs: postgres slow -->
  ~~~bash
  if true; then
      echo indented
  fi
  ~~~

~~~json
{"not": "run"}
~~~

<!-- cwd: repo -->
~~~console
$ echo a \\
    b
a b
$ true
~~~

~~~python
# jobs/x.py
def run(): ...
~~~
""")


def test_parse_finds_kinds_markers_outputs_and_files() -> None:
    page = parse(PAGE, "p.md")
    kinds = [(b.kind, b.line) for b in page.blocks]
    assert kinds == [("python", 4), ("python", 14), ("bash", 21), ("console", 32), ("python", 39)]
    first, skipped, bash, console, file = page.blocks
    assert first.text == "x = 1" and first.expected == "one"
    assert skipped.skip == "a signature"
    assert bash.needs == {"postgres", "slow"} and bash.text.startswith("if true; then\n    echo")
    assert console.in_repo and docblocks.console_steps(console.text) == [
        ("echo a \n    b", "a b"),
        ("true", ""),
    ]
    assert file.file == "jobs/x.py" and first.file is None
    assert page.services == {"postgres"} and page.needs == {"postgres", "slow"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- not-run -->\n~~~python\nx\n~~~\n", "unknown marker"),
        ("<!-- not run: -->\n~~~python\nx\n~~~\n", "unknown marker"),
        ("<!-- setup: the job -->\n~~~python\nx\n~~~\n", "unknown marker"),
        ("<!-- needs: oracle -->\n~~~python\nx\n~~~\n", "unknown needs"),
        ("<!-- output -->\n~~~text\nx\n~~~\n", "must follow a python or bash block"),
        ("~~~console\n$ a\n~~~\n<!-- output -->\n~~~text\nx\n~~~\n", "must follow"),
        ("<!-- needs: s3 -->\n~~~json\n{}\n~~~\n", "never runs"),
        ("~~~console\nno prompt\n~~~\n", r"'\$ ' command lines"),
        ("~~~python\nx\n", "not closed"),
    ],
)
def test_parse_refuses_what_breaks_the_convention(text: str, message: str) -> None:
    with pytest.raises(DocsError, match=message):
        parse(md(text), "bad.md")


# -- names: pasted in order, and alone ------------------------------------------------------

# docs/quickstart.md before issue 35: the check rebound the job's `orders` to an empty stream,
# and the drop-in sink below it wrote nothing, without an error.
REBOUND = md("""
<!-- setup -->
~~~python
orders = spark.readStream.parquet("data/input")
coordinator = Coordinator([FilesSink("data/orders", uid="orders")], log="data/txlog")
~~~

~~~python
orders = spark.readStream.parquet("doccheck/input")
coordinator = Coordinator([FilesSink("doccheck/orders", uid="orders")], log="doccheck/txlog")
print(coordinator.check(orders))
~~~

~~~python
orders.writeStream.foreachBatch(FilesSink("data/alone", uid="orders", log="data/l")).start()
~~~

~~~python
coordinator = Coordinator([FilesSink("data/both", uid="both")], log="data/both-txlog")
~~~
""")


def test_a_block_that_rebinds_a_name_a_later_block_uses_is_named() -> None:
    problems = docnames.rebinding_problems(parse(REBOUND, "q.md"))
    assert len(problems) == 1, problems  # `coordinator` is rebound too, but no later block reads it
    assert problems[0].startswith("q.md:8 rebinds 'orders' (bound at q.md:3), which q.md:14 uses")


def test_names_bound_in_functions_imports_and_comprehensions_count_as_theirs() -> None:
    page = parse(
        md("""
~~~python
import os
from x import y
def f():
    return y + os.sep
n = [i for i in range(3)]
~~~

~~~python
import os
print(f(), n, len(os.sep))
~~~
"""),
        "n.md",
    )
    first, second = docnames.python_blocks(page)
    assert first[1].bound == {"os", "y", "f", "n"} and first[1].free == set()
    assert second[1].free == {"f", "n"}
    assert not docnames.rebinding_problems(page)  # a re-import binds the same module
    assert docnames.alone_problems(page) == [
        "n.md:10 uses 'f', 'n', bound by no block above it marked <!-- setup -->: pasted "
        "alone, it fails; mark the block that binds it as setup, or bind it here"
    ]


def test_alone_is_each_block_after_the_setup_above_it() -> None:
    page = parse(REBOUND, "q.md")
    assert [b.setup for b in page.blocks] == [True, False, False, False]
    parts = docrun.alone(page)
    assert [[b.line for b in part.blocks] for part in parts] == [[3], [3, 8], [3, 14], [3, 18]]


def test_a_block_that_relies_on_a_block_not_marked_setup_fails_alone(tmp_path: Path) -> None:
    page = parse(md("~~~python\nx = 1\n~~~\n\n~~~python\nprint(x)\n~~~\n"), "a.md")
    assert statuses(run_page(page, tmp_path / "order", docrun.docs_env())) == ["passed"] * 2
    with pytest.raises(
        AssertionError, match=r"a\.md:5 alone, run after the page's setup(?s:.*)NameError"
    ):
        docrun.check_blocks_alone(page, tmp_path / "alone", docrun.docs_env())
    marked = parse(
        md("<!-- setup -->\n~~~python\nx = 1\n~~~\n\n~~~python\nprint(x)\n~~~\n"), "b.md"
    )
    docrun.check_blocks_alone(marked, tmp_path / "marked", docrun.docs_env())


# A query's shape without Spark: what matters is the block's text and what it logs.
QUERY = """
class Stream:
    def foreachBatch(self, f): return self
    def start(self): return self
"""


def test_a_query_that_writes_through_txsink_and_logs_no_epoch_fails(tmp_path: Path) -> None:
    silent = md(f"~~~python\n{QUERY}Stream().foreachBatch(print).start()\n~~~\n")
    outcomes = run(silent, tmp_path / "silent")
    assert statuses(outcomes) == ["failed"] and "txsink logged no epoch" in outcomes[0].detail
    line = "import sys; print('txsink: [orders epoch 0] committed: 1 rows', file=sys.stderr)"
    logged = md(f"~~~python\n{QUERY}Stream().foreachBatch(print).start()\n{line}\n~~~\n")
    assert statuses(run(logged, tmp_path / "logged")) == ["passed"]
    not_a_query = md(f"~~~python\n{QUERY}Stream().foreachBatch(print)\n~~~\n")
    assert statuses(run(not_a_query, tmp_path / "none")) == ["passed"]


# -- comparing ----------------------------------------------------------------------------


def test_ellipsis_is_any_text_in_a_line_or_any_lines() -> None:
    assert matches("a ... c", "a bbb c")
    assert matches("a\n...\nz", "a\nb\nc\nz")
    assert matches("a\n...\nz", "a\nz")
    assert matches("  x  \n\n", "\n  x\n")  # trailing spaces and blank edges do not count
    assert not matches("a ... c", "a b\nc")  # inline ... stays within its line
    assert not matches("a\nb", "a\nb\nc")
    assert not matches("{'x': 1}", "{'x': 2}")


# -- running ------------------------------------------------------------------------------


def run(text: str, tmp_path: Path, *, slow: bool = False) -> list[docrun.Outcome]:
    page = parse(md(text), "t.md")
    return run_page(page, tmp_path, docrun.docs_env(), slow=slow, timeout=60)


def statuses(outcomes: list[docrun.Outcome]) -> list[str]:
    return [o.status for o in outcomes]


def test_python_blocks_share_one_interpreter_and_their_output_is_compared(tmp_path: Path) -> None:
    page = """
~~~python
import os
x = 41
~~~

~~~bash
echo from bash > made-by-bash.txt
~~~

~~~python
print(x + 1, open("made-by-bash.txt").read().strip(), os.getcwd() == os.path.abspath("."))
~~~

<!-- output -->
~~~text
42 from bash True
~~~
"""
    assert statuses(run(page, tmp_path)) == ["passed", "passed", "passed"]


def test_a_wrong_output_fails_and_stops_the_page(tmp_path: Path) -> None:
    page = """
~~~python
print("actual")
~~~

<!-- output -->
~~~text
expected
~~~

~~~bash
touch never
~~~
"""
    outcomes = run(page, tmp_path)
    assert statuses(outcomes) == ["failed", "not reached"]
    assert "-expected\n+actual" in outcomes[0].detail
    assert not (tmp_path / "work" / "never").exists()


def test_an_exception_names_the_line_of_the_page(tmp_path: Path) -> None:
    outcomes = run("\n~~~python\nx = 1\nraise ValueError('boom')\n~~~\n", tmp_path)
    assert statuses(outcomes) == ["failed"]
    assert 'File "t.md", line 4' in outcomes[0].detail and "ValueError: boom" in outcomes[0].detail


def test_a_failing_command_fails_with_set_e(tmp_path: Path) -> None:
    outcomes = run("~~~bash\nfalse\necho not reached\n~~~\n", tmp_path)
    assert statuses(outcomes) == ["failed"] and "exit code 1" in outcomes[0].detail


def test_console_output_is_compared_per_command(tmp_path: Path) -> None:
    good = "~~~console\n$ echo one two\none ...\n$ printf 'a\\nb\\n'\na\nb\n~~~\n"
    assert statuses(run(good, tmp_path / "good")) == ["passed"]
    bad = "~~~console\n$ echo one\none\n$ echo two\nthree\n~~~\n"
    outcomes = run(bad, tmp_path / "bad")
    assert statuses(outcomes) == ["failed"] and "$ echo two" in outcomes[0].detail


def test_not_run_and_slow_blocks_are_skipped_unless_slow(tmp_path: Path) -> None:
    page = """
<!-- not run: never -->
~~~bash
false
~~~

<!-- needs: slow -->
~~~bash
touch slow-ran
~~~
"""
    assert statuses(run(page, tmp_path / "a")) == ["skipped", "skipped"]
    assert statuses(run(page, tmp_path / "b", slow=True)) == ["skipped", "passed"]
    assert (tmp_path / "b" / "work" / "slow-ran").exists()


def test_a_file_block_is_written_and_must_compile(tmp_path: Path) -> None:
    good = "~~~python\n# jobs/job.py\ndef run():\n    return 1\n~~~\n"
    assert statuses(run(good, tmp_path / "a")) == ["passed"]
    assert (tmp_path / "a" / "work" / "jobs" / "job.py").read_text().startswith("# jobs/job.py")
    bad = "~~~python\n# job.py\ndef run(:\n~~~\n"
    outcomes = run(bad, tmp_path / "b")
    assert statuses(outcomes) == ["failed"] and "does not compile" in outcomes[0].detail


def test_the_venv_comes_first_and_repo_blocks_run_in_the_repository(tmp_path: Path) -> None:
    page = f"""
~~~console
$ command -v python
{docrun.venv_bin()}/python
~~~

<!-- cwd: repo -->
~~~bash
test -f pyproject.toml && test -d docs
~~~
"""
    assert statuses(run(page, tmp_path)) == ["passed", "passed"]


def test_a_block_that_hangs_times_out(tmp_path: Path) -> None:
    page = parse(md("~~~python\nimport time\ntime.sleep(60)\n~~~\n"), "t.md")
    outcomes = run_page(page, tmp_path, docrun.docs_env(), timeout=1)
    assert statuses(outcomes) == ["failed"] and "timed out" in outcomes[0].detail


def test_check_page_raises_with_the_summary(tmp_path: Path) -> None:
    page = parse(md("~~~bash\nexit 3\n~~~\n"), "t.md")
    with pytest.raises(AssertionError, match=r"t.md: a block failed\nfailed .* t.md:1 \(bash\)"):
        docrun.check_page(page, tmp_path, docrun.docs_env())


def test_block_name_is_page_and_line() -> None:
    assert Block("docs/x.md", 12, "bash", "true").name == "docs/x.md:12"
