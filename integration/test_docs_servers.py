"""Docs that run (docs/testing.md): the pages whose blocks need a test server.

Each page runs with the markers of its ``needs:`` (so ``-m "not kafka"`` deselects it) and
the ``TXSINK_*`` variables of those services in its environment, as the services' fixtures
give them (``.env()``: the same variables the connectors' testing adapters read).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import docblocks, docrun

# Starts Spark drivers in child processes: the session builds the CDS archive first.
pytestmark = pytest.mark.spark


def _param(page: docblocks.Page) -> object:
    marks = [getattr(pytest.mark, name) for name in sorted(page.services)]
    return pytest.param(page, id=page.path, marks=marks)


def services_env(request: pytest.FixtureRequest, services: frozenset[str]) -> dict[str, str]:
    """The ``TXSINK_*`` variables of the named services (started once per session).

    A ``needs:`` name is a service marker; its fixture is conftest.py's ``SERVICE_MARKERS``.
    """
    env: dict[str, str] = {}
    for name in sorted(services):
        fixture = "schema_registry" if name == "registry" else name
        env.update(request.getfixturevalue(fixture).env())
    return env


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("page", [_param(p) for p in docblocks.pages_to_run(servers=True)])
def test_page_runs_against_the_test_servers(
    page: docblocks.Page, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = docrun.docs_env(services_env(request, page.services))
    docrun.check_page(page, tmp_path, env, slow=docblocks.run_slow(request.config))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("page", [_param(p) for p in docblocks.pages_to_run(servers=True)])
def test_each_block_runs_alone_after_the_page_setup(
    page: docblocks.Page, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = docrun.docs_env(services_env(request, page.services))
    docrun.check_blocks_alone(page, tmp_path, env, slow=docblocks.run_slow(request.config))


@pytest.mark.postgres
def test_a_page_gets_its_servers_variables(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    page = docblocks.parse(
        "<!-- needs: postgres -->\n```python\n"
        "import os, psycopg\n"
        "with psycopg.connect(os.environ['TXSINK_PG_DSN']) as conn:\n"
        "    print(conn.execute('SELECT 40 + 2').fetchone()[0])\n"
        "```\n\n<!-- output -->\n```text\n42\n```\n",
        "servers.md",
    )
    assert page.services == {"postgres"}
    without = docrun.run_page(page, tmp_path / "a", docrun.docs_env(base={"PATH": ""}))
    assert [o.status for o in without] == ["failed"] and "KeyError" in without[0].detail
    env = docrun.docs_env(services_env(request, page.services))
    assert [o.status for o in docrun.run_page(page, tmp_path / "b", env)] == ["passed"]
