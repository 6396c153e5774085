"""What the testing toolkit needs from a connector: one adapter object per connector.

A connector registers its adapter in its :class:`~txsink.registry.Connector` record
(``testing="mypkg.testing:ADAPTER"``). Through it, with no code of their own for any
connector, the chaos runner and ``txsink chaos soak`` build the sinks of a pipeline in a
child process, the verifiers read each target back, the cross-system observer watches
the targets during a run, and ``txsink.testing.contract`` checks the sink contract; the
integration suite runs its crash matrices over every registered adapter.

Targets are described by a *spec*: a JSON object ``{"kind": <connector name>,
"uid": ..., ...}`` that names no secret. Servers are found through environment
variables (:attr:`ConnectorTesting.env_vars`); every method takes the environment as
a mapping, so a test can point one target at a proxy without touching ``os.environ``.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from txsink import registry
from txsink.schema import check_policy

if TYPE_CHECKING:
    from txsink.contract import SinkContract
    from txsink.store import LogStore
    from txsink.testing.observer import Target
    from txsink.testing.verifiers import SinkVerifier

__all__ = ["ConnectorTesting", "adapter", "adapters", "build_sink"]


class ConnectorTesting(abc.ABC):
    """A connector's testing adapter. Subclass it next to the connector and register it.

    The contract of each method is in its docstring; none may hide a failure (a
    verifier that cannot read its target raises, it never returns "nothing").
    """

    #: The connector's registered name; a spec's ``"kind"``.
    name: ClassVar[str]
    #: Environment variables that locate the connector's server; all set = available.
    #: Empty for a connector that needs no server.
    env_vars: ClassVar[tuple[str, ...]] = ()
    #: The services of the integration harness (``integration/services``) it needs.
    services: ClassVar[tuple[str, ...]] = ()
    #: Named option sets the crash matrices and the contract suite run, each passed to
    #: :meth:`new_target` as keyword arguments (e.g. Kafka's two modes).
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {"default": {}}
    #: The variants whose sink commits in its tasks (single-pass epochs): the crash
    #: matrices add the single-pass points (``before_task_commit``) for them.
    single_pass_variants: ClassVar[frozenset[str]] = frozenset()
    #: Variants that differ from another one only in where they keep their state (Kafka's
    #: WAL on S3): the integration suite runs a few of their crash-matrix cells by default
    #: and the rest, with their kill-driver run, only with ``--run-slow``.
    slow_variants: ClassVar[frozenset[str]] = frozenset()
    #: Option sets for the integration harness's secured servers (TLS, a least-privileged
    #: principal, the administrators' own login): run by the secured contract suite and
    #: crash-matrix subset (``integration/test_secure_matrix.py``), never by the ordinary
    #: matrices. Under these options :meth:`new_target` makes the target and grants the
    #: least rights as the administrators, :meth:`build_sink` connects as the
    #: least-privileged principal, and :meth:`verifier` reads back as the administrators.
    secure_variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: The harness's secured services those variants need.
    secure_services: ClassVar[tuple[str, ...]] = ()
    #: A poison row for the chaos toolkit (:mod:`txsink.testing.disturb`): options for
    #: :meth:`new_target` under which the target refuses a row whose ``payload`` is longer
    #: than the number given, deterministically (e.g. a topic's ``max.message.bytes``), so
    #: the sink must refuse it before the decision. ``None``: nothing to poison.
    poison: ClassVar[tuple[Mapping[str, Any], int] | None] = None

    def available(self, env: Mapping[str, str] | None = None) -> bool:
        """True when every :attr:`env_vars` is set (the server can be reached)."""
        source = os.environ if env is None else env
        return all(source.get(var) for var in self.env_vars)

    @abc.abstractmethod
    def new_target(
        self, workdir: Path, tag: str, env: Mapping[str, str], **options: Any
    ) -> dict[str, Any]:
        """Create a fresh, empty target (table, topic, bucket, folder) and return its spec.

        ``tag`` is unique per call (``[a-z0-9_]``): use it in names so concurrent runs do
        not meet; ``workdir`` is a folder for local state (a WAL, say). ``options`` are a
        :attr:`variants` entry or a test's own (a uid, a mode). The spec must be
        JSON-able, name no secret, and work in :meth:`build_sink` in another process
        given :meth:`child_env`.
        """

    def sink_options(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The sink's own parameters in a spec, as ``format("txsink")`` takes them: the
        spec without ``kind`` and without any key only the adapter reads (which server of
        the harness, say). Default: every key but ``kind``."""
        return {key: value for key, value in spec.items() if key != "kind"}

    @abc.abstractmethod
    def build_sink(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> SinkContract[Any, Any]:
        """The sink a spec describes (in the test process or in a pipeline's child)."""

    @abc.abstractmethod
    def verifier(
        self,
        spec: Mapping[str, Any],
        expected: Iterable[int],
        env: Mapping[str, str],
        *,
        log: str | None = None,
    ) -> SinkVerifier:
        """A verifier that reads the target back as a downstream reader would.

        ``log`` is the run's txsink log, for verifiers that count only this app's
        leftovers. Lingering leftovers are counted with the target's own means
        (its catalog of prepared transactions, open uploads, open transactions).
        """

    def observer_targets(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> list[Target]:
        """What the cross-system observer samples: the guaranteed view, and any boundary
        views (``guaranteed=False``) worth reporting next to it. Default: none."""
        return []

    def log_store(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> LogStore | None:
        """A txsink log kept in the target's own system, for the crash matrix's driver-side
        points to exercise it too (the S3 connector's log on S3). Default: none (a local
        folder holds the log)."""
        return None

    def drop_target(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> None:
        """Remove a target :meth:`new_target` made (its table, topic, bucket), best effort.

        Called after a test; prepared transactions the run left must be gone by then (a
        test that leaves any has failed already). Default: nothing to remove.
        """
        return None

    def child_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The variables a child process needs for :meth:`build_sink` (default:
        :attr:`env_vars` as they are in ``env``)."""
        return {var: env[var] for var in self.env_vars if var in env}


def adapters(*, env: Mapping[str, str] | None = None) -> dict[str, ConnectorTesting]:
    """Every registered connector's adapter, by name; with ``env``, only those available."""
    found: dict[str, ConnectorTesting] = {}
    for name, record in registry.connectors().items():
        if record.testing is None:
            continue
        candidate = record.load_testing()
        if env is None or candidate.available(env):
            found[name] = candidate
    return found


def adapter(name: str) -> ConnectorTesting:
    """The adapter of the registered connector ``name``."""
    found = registry.connector(name).load_testing()
    if not isinstance(found, ConnectorTesting):
        raise TypeError(f"connector {name!r} registers a testing adapter that is not one")
    return found


def build_sink(spec: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Any:
    """The sink a spec describes, through its connector's adapter. A spec's
    ``schema_evolution`` (every connector takes it: :mod:`txsink.schema`) is set here, so
    no adapter needs to know it."""
    policy = spec.get("schema_evolution")
    own = {k: v for k, v in spec.items() if k != "schema_evolution"}
    sink = adapter(str(spec["kind"])).build_sink(own, os.environ if env is None else env)
    if policy is not None:
        sink.schema_evolution = check_policy(policy)
    return sink
