"""The Postgres sink's least rights (``txsink.connectors.postgres.grants``) and the page that
shows them: every ``-- grants:`` SQL block of ``docs/security.md`` is the module's output for
the options its first line names, so the docs grant exactly what the check asks for (and
what ``integration/test_postgres_secure.py`` grants)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from txsink.connectors.postgres.grants import rights, setup_sql

PAGE = Path(__file__).resolve().parent.parent / "docs" / "security.md"
_BLOCK = re.compile(r"```sql\n(-- grants: (.*?)\n)(.*?)```", re.DOTALL)
_OPTION = re.compile(r'(\w+)="([^"]*)"')


def _blocks() -> list[tuple[str, str]]:
    return [(m.group(2), m.group(3)) for m in _BLOCK.finditer(PAGE.read_text())]


def test_the_page_shows_every_combination() -> None:
    heads = [head for head, _ in _blocks()]
    assert len(heads) >= 6
    for combo in ('commit="2pc", mode="append"', 'commit="2pc", mode="upsert"'):
        assert any(h.startswith(combo) for h in heads)
    assert sum('commit="staging"' in h for h in heads) >= 3


@pytest.mark.parametrize(("head", "body"), _blocks(), ids=[h for h, _ in _blocks()])
def test_each_sql_block_is_the_modules_output(head: str, body: str) -> None:
    options = dict(_OPTION.findall(head))
    made = "progress table created by the sink" not in head
    needed = rights(
        schema="app",
        table="events",
        mode=options["mode"],
        commit=options["commit"],
        staging_schema=options.get("staging_schema"),
        progress_exists=made,
    )
    expected = setup_sql(
        "txsink_app", needed, progress=("app", "txsink_progress") if made else None
    )
    assert body == expected


def test_rights_by_mode() -> None:
    def names(**options: str) -> set[str]:
        found = rights(schema="s", table="t", **options)  # type: ignore[arg-type]
        return {f"{r.privilege} {r.on}" for r in found}

    progress = {f"{p} table s.txsink_progress" for p in ("SELECT", "INSERT", "DELETE")}
    assert names() == {"USAGE schema s", "INSERT table s.t"} | progress
    assert names(mode="upsert") >= {"UPDATE table s.t", "SELECT table s.t", "CREATE schema s"}
    assert "CREATE schema s" not in names(mode="append")
    staged = names(commit="staging", staging_schema="z")
    assert {"SELECT table s.t", "USAGE schema z", "CREATE schema z"} <= staged
    assert "CREATE schema s" not in staged


def test_a_grant_quotes_its_identifiers() -> None:
    (right,) = [
        r
        for r in rights(schema='we"ird', table="Order Lines")
        if r.privilege == "INSERT" and r.name == "Order Lines"
    ]
    assert (
        right.grant('a "role"') == 'GRANT INSERT ON TABLE "we""ird"."Order Lines" TO "a ""role""";'
    )
    assert right.revoke("r") == 'REVOKE INSERT ON TABLE "we""ird"."Order Lines" FROM "r";'


def test_unknown_options_are_refused() -> None:
    with pytest.raises(ValueError, match="no such mode"):
        rights(schema="s", table="t", mode="merge")
