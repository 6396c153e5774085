"""The sink contract against a real SQLite file: the whole test a new connector needs to
write (txsink's own integration suite adds the crash matrices once it is registered)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from txsink_sqlite.testing import ADAPTER

from txsink.testing import contract


@pytest.mark.parametrize("check", contract.CHECKS, ids=contract.CHECK_NAMES)
def test_contract(check: Callable[[contract.ContractRun], None], tmp_path: Path) -> None:
    check(contract.ContractRun(ADAPTER, tmp_path))
