"""The sink contract (``txsink.testing.contract``) for every registered connector and variant,
against its real target: one test per (connector, variant, check).

A new connector gets these by registering its testing adapter; nothing here names one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import services_for
from txsink.testing import contract
from txsink.testing.adapter import adapter, adapters


def _matrix(found: Any, variant: str) -> list[Any]:
    """The compatibility matrix (``--matrix``, every Spark line) runs each connector's first
    variant and the variants that commit in their tasks (Kafka direct)."""
    if variant == next(iter(found.variants)) or variant in found.single_pass_variants:
        return [pytest.mark.matrix("contract")]
    return []


def _cases() -> list[Any]:
    return [
        pytest.param(
            name,
            variant,
            check,
            marks=[
                *[getattr(pytest.mark, service) for service in found.services],
                *_matrix(found, variant),
            ],
            id=f"{name}-{variant}-{check.__name__}",
        )
        for name, found in adapters().items()
        for variant in found.variants
        for check in contract.CHECKS
    ]


@pytest.mark.parametrize(("connector", "variant", "check"), _cases())
def test_contract(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    connector: str,
    variant: str,
    check: Callable[[contract.ContractRun], None],
) -> None:
    env: dict[str, str] = {}
    for service in services_for(request, [connector]).values():
        env.update(service.env())
    found = adapter(connector)
    run = contract.ContractRun(found, tmp_path, env=env, options=found.variants[variant])
    try:
        check(run)
    finally:
        run.drop()
