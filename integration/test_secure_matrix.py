"""The guarantees on the secured profile (issue 40, point 3): the sink contract and a
crash-matrix subset against the harness's secured servers, through each connector's
least-privileged principal over verified TLS, read back by the administrators' clients.

Which connectors and how comes from their testing adapters' ``secure_variants`` (nothing
here names one): under those options the adapter makes the target and grants the least
rights as the administrators, builds the sink as the least-privileged principal, and its
verifier reads back as the administrators (zero duplicates, zero missing, nothing left
prepared). The runs themselves are ``test_matrix.py``'s (``run_cell``, ``run_kill_driver``)
and ``txsink.testing.contract``'s checks.

By default: per connector, its first secured variant's two cheapest contract checks
(prepare, and commit from a new driver; no Spark); and one kill-driver run into that
variant's target of every connector at once (one coordinator: the driver SIGKILLed after
the decision of epoch 1, restarted by the runner). With ``--run-slow``, per secured variant
(a connector's others too): every contract check, every crash point once with ``raise`` (in
the shared SparkSession, driver points with the txsink log in the target's system where the
adapter keeps one), the kill-driver run after the decision, and the kill-driver run at
every point once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _services.common import ServiceError, real_servers_required, redact
from _services.resolve import resolve_kafka_secure, resolve_postgres_secure, resolve_s3_secure
from test_matrix import run_cell, run_kill_driver

from tests.streaming import CRASH_MATRIX
from txsink.testing import contract
from txsink.testing.adapter import adapters
from txsink.testing.targets import RunTarget

#: How each secured service of the harness is found (started if need be).
RESOLVE: dict[str, Callable[[], dict[str, str]]] = {
    "kafka_secure": resolve_kafka_secure,
    "postgres_secure": resolve_postgres_secure,
    "s3_secure": resolve_s3_secure,
}
#: The contract checks the default suite runs per secured variant (no child process).
QUICK_CHECKS = {"nothing_visible_before_commit", "commit_is_idempotent"}
#: The default kill-driver cell: recovery has a decided, uncommitted epoch to finish.
QUICK_KILL = "after_decision:kill-driver@1"
#: Every crash point once, raising (the task points once: Spark's retry absorbs them).
RAISE_CELLS = [cell for cell in CRASH_MATRIX if cell[1] == "raise" and cell[2] == 1]

_found: dict[str, dict[str, str]] = {}


def _secured() -> list[tuple[str, str, list[Any]]]:
    return [
        (name, variant, [getattr(pytest.mark, s) for s in found.secure_services])
        for name, found in adapters().items()
        for variant in found.secure_variants
    ]


def _quick(connector: str, variant: str) -> bool:
    """The connector's first secured variant: its cheapest checks run by default."""
    return variant == next(iter(adapters()[connector].secure_variants))


def _env(connector: str) -> dict[str, str]:
    """The environment with the connector's secured servers (each resolved once); skipped
    when one cannot start, an error under ``CI=true``."""
    env = dict(os.environ)
    for service in adapters()[connector].secure_services:
        if service not in _found:
            try:
                _found[service] = RESOLVE[service]()
            except (ServiceError, OSError, KeyError) as exc:
                message = f"{service} is unavailable: {redact(str(exc))}"
                if real_servers_required():
                    pytest.fail(message, pytrace=False)
                pytest.skip(message)
        env.update(_found[service])
    return env


def _target(request: pytest.FixtureRequest, tmp: Path, connector: str, variant: str) -> RunTarget:
    """A fresh secured target (made by the administrators), dropped when the test ends."""
    found = adapters()[connector]
    env = _env(connector)
    tag = f"sec_{os.urandom(4).hex()}"
    spec = found.new_target(tmp, tag, env, **dict(found.secure_variants[variant]))
    target = RunTarget(connector, spec, env)
    request.addfinalizer(lambda: found.drop_target(spec, env))
    return target


@pytest.mark.parametrize(
    ("connector", "variant", "check"),
    [
        pytest.param(
            name,
            variant,
            check,
            marks=[
                *marks,
                *(
                    []
                    if check.__name__ in QUICK_CHECKS and _quick(name, variant)
                    else [pytest.mark.slow]
                ),
            ],
            id=f"{name}-{variant}-{check.__name__}",
        )
        for name, variant, marks in _secured()
        for check in contract.CHECKS
    ],
)
def test_secure_contract(
    tmp_path: Path, connector: str, variant: str, check: Callable[[contract.ContractRun], None]
) -> None:
    found = adapters()[connector]
    run = contract.ContractRun(
        found, tmp_path, env=_env(connector), options=found.secure_variants[variant]
    )
    try:
        check(run)
    finally:
        run.drop()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    ("connector", "variant", "point", "mode", "times"),
    [
        pytest.param(name, variant, *cell, marks=marks, id=f"{name}-{variant}-{cell[0]}")
        for name, variant, marks in _secured()
        for cell in RAISE_CELLS
    ],
)
def test_secure_crash_matrix(
    spark: Any,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    connector: str,
    variant: str,
    point: str,
    mode: str,
    times: int,
) -> None:
    run_cell(spark, tmp_path, _target(request, tmp_path, connector, variant), point, mode, times)


@pytest.mark.chaos
@pytest.mark.parametrize(
    ("connector", "variant", "points"),
    [
        param
        for name, variant, marks in _secured()
        for param in (
            pytest.param(
                name,
                variant,
                QUICK_KILL,
                marks=[*marks, pytest.mark.slow],
                id=f"{name}-{variant}-after-decision",
            ),
            pytest.param(
                name,
                variant,
                None,
                marks=[*marks, pytest.mark.slow],
                id=f"{name}-{variant}-every-point",
            ),
        )
    ],
)
def test_secure_kill_driver(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    connector: str,
    variant: str,
    points: str | None,
) -> None:
    target = _target(request, tmp_path, connector, variant)
    single_pass = variant in adapters()[connector].single_pass_variants
    run_kill_driver(tmp_path, [target], single_pass=single_pass, points=points)


@pytest.mark.chaos
@pytest.mark.parametrize(
    "secured",
    [
        pytest.param(
            [(n, v) for n, v, _ in _secured() if _quick(n, v)],
            marks=[
                getattr(pytest.mark, service)
                for service in sorted(
                    {
                        s
                        for found in adapters().values()
                        if found.secure_variants
                        for s in found.secure_services
                    }
                )
            ],
            id="every-secured-variant",
        )
    ],
)
def test_secure_kill_driver_after_the_decision(
    request: pytest.FixtureRequest, tmp_path: Path, secured: list[tuple[str, str]]
) -> None:
    """The default suite's kill-driver cell: a secured target of every connector (its first
    secured variant; the others' kill-driver runs are ``test_secure_kill_driver``'s, with
    ``--run-slow``) in one query, the driver killed after the decision of epoch 1; the
    restart commits it in each, exactly once."""
    targets = [_target(request, tmp_path, name, variant) for name, variant in secured]
    run_kill_driver(tmp_path, targets, points=QUICK_KILL)


def test_every_secured_variant_covers_every_crash_point() -> None:
    """The raise cells name every crash point a foreachBatch sink meets, once."""
    from txsink.protocol.faults import CrashPoint

    named = {cell[0] for cell in RAISE_CELLS}
    assert len(named) == len(RAISE_CELLS)
    assert named == {str(p) for p in CrashPoint} - {"before_task_commit"}
    assert _secured(), "no connector registers a secured variant"
