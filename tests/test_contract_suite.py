"""The contract suite itself: it passes a correct connector and catches each broken contract.

The files connector (no server) stands in for any connector; ``contract_mutants`` breaks
one contract per sink class. A suite that a broken sink passes would be a defect.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests import contract_mutants as m
from txsink.connectors.files.testing import FilesTesting
from txsink.testing import contract
from txsink.testing.adapter import ConnectorTesting


@pytest.mark.parametrize("check", contract.CHECKS, ids=contract.CHECK_NAMES)
def test_the_files_connector_keeps_every_contract(
    tmp_path: Path, check: Callable[[contract.ContractRun], None]
) -> None:
    check(contract.ContractRun(FilesTesting(), tmp_path))


@pytest.mark.parametrize(
    ("mutant", "caught_by"),
    [
        (m.VisibleEarly, "nothing_visible_before_commit"),
        (m.DuplicatingCommit, "commit_is_idempotent"),
        (m.AssumesCommitted, "already_committed_is_verified"),
        (m.ListsNothing, "crashed_attempt_is_listed"),
        (m.AbortKeeps, "abort_is_idempotent"),
        (m.Silent, "nothing_visible_before_commit"),
        (m.RecordsAnyApp, "recorded_epoch_is_reported"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
def test_each_broken_contract_is_caught(tmp_path: Path, mutant: type, caught_by: str) -> None:
    adapter: ConnectorTesting = m.MutantTesting(mutant)
    (check,) = [c for c in contract.CHECKS if c.__name__ == caught_by]
    with pytest.raises(AssertionError):
        check(contract.ContractRun(adapter, tmp_path))
