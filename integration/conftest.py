"""Real-server fixtures for integration tests: ``postgres``, ``kafka``, ``s3``, ``schema_registry``.

A test marked ``@pytest.mark.postgres`` / ``kafka`` / ``s3`` / ``registry`` gets its server
started (once per session) even if it does not name the fixture; a test that names the
fixture gets the marker, so ``-m "not kafka"`` deselects it. Servers come from the
``TXSINK_*`` environment variables, else testcontainers (Docker; not for the registry), else
local processes; see docs/testing.md.

What each test creates through ``new_schema()`` / ``new_topic()`` / ``new_bucket()`` /
``new_subject()`` (and the ``with_proxy()`` proxies) is removed right after that test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from _services.common import ServiceError, real_servers_required, redact
from _services.fixtures import (
    Finalizer,
    KafkaService,
    PostgresService,
    RegistryService,
    S3Service,
)
from _services.resolve import (
    resolve_kafka,
    resolve_postgres,
    resolve_postgres_stock,
    resolve_registry,
    resolve_s3,
    session_finalizers,
)
from connect_server import ConnectServer
from cross import Cross
from leaks import *  # noqa: F403 - its hooks: the leak checks after every test

from txsink.testing.targets import RunTarget, new_targets

# marker -> the session fixture that provides its server
SERVICE_MARKERS = {
    "postgres": "postgres",
    "postgres_stock": "postgres_stock",
    "kafka": "kafka",
    "s3": "s3",
    "registry": "schema_registry",
}


class _Cleanable(Protocol):
    def cleanup(self) -> None: ...


_active: dict[str, _Cleanable] = {}
T = TypeVar("T", PostgresService, KafkaService, S3Service, RegistryService)


def pytest_report_header() -> list[str]:
    keys = (
        "TXSINK_PG_DSN",
        "TXSINK_PG_STOCK_DSN",
        "TXSINK_KAFKA_BOOTSTRAP",
        "TXSINK_S3_ENDPOINT",
        "TXSINK_S3_SERVER",
        "TXSINK_SCHEMA_REGISTRY_URL",
    )
    shown = [f"{k}={redact(os.environ[k])}" for k in keys if os.environ.get(k)]
    return [f"txsink services: {' '.join(shown) if shown else 'from Docker or local processes'}"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        for marker, fixture in SERVICE_MARKERS.items():
            if fixture in names and item.get_closest_marker(marker) is None:
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(scope="session")
def _service_finalizers() -> Iterator[list[Finalizer]]:
    with session_finalizers() as finalizers:
        yield finalizers


def _obtain(name: str, resolve: Callable[[list[Finalizer]], T], fins: list[Finalizer]) -> T:
    try:
        service = resolve(fins)
    except (ServiceError, OSError) as exc:
        message = f"{name} server unavailable: {redact(str(exc))}"
        # Under CI a missing real server fails the run: skipping would pass it untested.
        if os.environ.get("TXSINK_SKIP_UNAVAILABLE") == "1" and not real_servers_required():
            pytest.skip(message)
        pytest.fail(message, pytrace=False)
    _active[name] = service
    return service


@pytest.fixture(scope="session")
def postgres(_service_finalizers: list[Finalizer]) -> PostgresService:
    """PostgreSQL with 2PC: ``.dsn``, ``.connect()``, ``.new_schema()``, ``.with_proxy()``."""
    return _obtain("postgres", resolve_postgres, _service_finalizers)


@pytest.fixture(scope="session")
def postgres_stock(_service_finalizers: list[Finalizer]) -> PostgresService:
    """PostgreSQL as it ships (``max_prepared_transactions = 0``): no two-phase commit."""
    return _obtain("postgres_stock", resolve_postgres_stock, _service_finalizers)


@pytest.fixture(scope="session")
def kafka(_service_finalizers: list[Finalizer]) -> KafkaService:
    """Kafka with transactions: ``.bootstrap``, ``.config()``, ``.new_topic()``, ``.with_proxy``."""
    return _obtain("kafka", resolve_kafka, _service_finalizers)


@pytest.fixture(scope="session")
def s3(_service_finalizers: list[Finalizer]) -> S3Service:
    """S3-compatible server: ``.endpoint``, ``.client()``, ``.new_bucket()``, ``.with_proxy()``."""
    return _obtain("s3", resolve_s3, _service_finalizers)


@pytest.fixture(scope="session")
def schema_registry(_service_finalizers: list[Finalizer]) -> RegistryService:
    """Confluent-compatible Schema Registry: ``.url``, ``.client()``, ``.new_subject()``."""
    return _obtain("registry", resolve_registry, _service_finalizers)


def server_connectors() -> list[str]:
    """The registered connectors that need a server of the harness."""
    from txsink.testing.adapter import adapters

    return [name for name, found in adapters().items() if found.services]


def services_for(request: pytest.FixtureRequest, connectors: Iterable[str]) -> dict[str, Any]:
    """The harness services the connectors' adapters need, started (once per session)."""
    from txsink.testing.adapter import adapter

    names = {s for c in connectors for s in adapter(c).services}
    return {name: request.getfixturevalue(SERVICE_MARKERS.get(name, name)) for name in names}


@pytest.fixture
def cross(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cross]:
    """A fresh target of every connector with a server, for one test (``cross.py``)."""
    connectors = server_connectors()
    made = Cross.create(connectors, services_for(request, connectors), tmp_path)
    yield made
    made.drop()


@pytest.fixture(autouse=True)
def _txsink_services(request: pytest.FixtureRequest) -> Iterator[None]:
    """Start the servers a test's markers ask for; afterwards drop what the test created."""
    for marker, fixture in SERVICE_MARKERS.items():
        if request.node.get_closest_marker(marker) is not None:
            request.getfixturevalue(fixture)
    yield
    for service in list(_active.values()):
        service.cleanup()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A real local Spark Connect server (``local[2,2]``), started once per test session on
    127.0.0.1 and a free port, stopped at the end: ``.url`` (``sc://127.0.0.1:PORT``),
    ``.kill()``, ``.restart()``. Clients run in child processes
    (``connect_server.client_cmd``): a Connect session cannot share this process with the
    classic one of the root conftest."""
    server = ConnectServer(tmp_path_factory.mktemp("connect-server"))
    server.start()
    yield server
    server.stop()


def variant_params(*, single_pass: bool = False) -> list[Any]:
    """``(connector, variant)`` parameters of every connector variant (``single_pass``: of
    those that commit in their tasks), marked with the services each needs."""
    from txsink.testing.adapter import adapters

    return [
        pytest.param(
            name,
            variant,
            marks=[getattr(pytest.mark, s) for s in found.services],
            id=f"{name}-{variant}",
        )
        for name, found in adapters().items()
        for variant in (sorted(found.single_pass_variants) if single_pass else found.variants)
    ]


def variant_target(
    request: pytest.FixtureRequest, tmp: Path, connector: str, variant: str, *, tag: str
) -> RunTarget:
    """A fresh target of ``connector``'s ``variant`` on the test servers, dropped when the
    test ends."""
    from txsink.testing.adapter import adapters

    env: dict[str, str] = {}
    for service in services_for(request, [connector]).values():
        env.update(service.env())
    options = dict(adapters()[connector].variants[variant])
    (target,) = new_targets([connector], tmp, tag=tag, env=env, options={connector: options})
    request.addfinalizer(lambda: target.adapter.drop_target(target.spec, target.env))
    return target
