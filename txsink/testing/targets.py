"""The targets of one test run, made through the connectors' adapters.

A run (a chaos plan, a soak plan, an integration test) writes to one fresh target per
connector; :func:`new_targets` makes them and returns :class:`RunTarget` objects that
know how to build the sink (here or in a pipeline's child process), read the target
back, and watch it during the run. Nothing here knows any connector.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txsink.testing.adapter import ConnectorTesting, adapter, adapters, build_sink

if TYPE_CHECKING:
    from txsink.testing.observer import Target
    from txsink.testing.verifiers import SinkVerifier

__all__ = ["RunTarget", "available_connectors", "child_env", "new_targets"]


def available_connectors(env: Mapping[str, str] | None = None) -> list[str]:
    """The registered connectors whose servers ``env`` (default: ``os.environ``) names;
    a connector that needs no server is always available."""
    return list(adapters(env=os.environ if env is None else env))


@dataclass(frozen=True)
class RunTarget:
    """One fresh target of a run.

    ``env`` reaches the target directly (verifiers and observers always use it);
    ``sink_env`` is what the sink is built with, the same unless a test routes the sink
    through a proxy (:meth:`through`).
    """

    connector: str
    spec: dict[str, Any]
    env: Mapping[str, str]
    sink_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def adapter(self) -> ConnectorTesting:
        return adapter(self.connector)

    @property
    def uid(self) -> str:
        return str(self.spec.get("uid", self.connector))

    def through(self, **overrides: str) -> RunTarget:
        """The same target, its sink built with some variables replaced (a proxy's address)."""
        return replace(self, sink_env={**self.env, **self.sink_env, **overrides})

    def sink(self) -> Any:
        """The sink, built in this process (as a pipeline's child builds it: with the
        spec's ``schema_evolution``)."""
        return build_sink(self.spec, self.sink_env or self.env)

    def verifier(self, expected: Iterable[int], *, log: str | None = None) -> SinkVerifier:
        return self.adapter.verifier(self.spec, expected, self.env, log=log)

    def observer_targets(self) -> list[Target]:
        return self.adapter.observer_targets(self.spec, self.env)

    def child_env(self) -> dict[str, str]:
        """What a pipeline's child process needs to build the sink."""
        return self.adapter.child_env(self.sink_env or self.env)


def new_targets(
    connectors: Sequence[str],
    workdir: str | os.PathLike[str],
    *,
    tag: str = "run",
    env: Mapping[str, str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[RunTarget]:
    """A fresh target per connector (names carry ``tag`` and a random suffix).

    ``options``: per connector name, keyword arguments for its adapter's ``new_target``
    (a variant, a uid). Raises ``ValueError`` naming the variables to set when a
    connector's server is not given in ``env``.
    """
    source = dict(os.environ if env is None else env)
    chosen = [adapter(name) for name in connectors]
    missing = [a for a in chosen if not a.available(source)]
    if missing:
        raise ValueError(
            "no server for " + ", ".join(f"{a.name} (set {', '.join(a.env_vars)})" for a in missing)
        )
    base = re.sub(r"[^a-z0-9_]", "_", tag.lower())
    out = []
    for a in chosen:
        unique = f"{base}_{uuid.uuid4().hex[:8]}"
        spec = a.new_target(Path(workdir), unique, source, **dict((options or {}).get(a.name, {})))
        out.append(RunTarget(a.name, spec, source))
    return out


def child_env(targets: Iterable[RunTarget]) -> dict[str, str]:
    """The union of the targets' child environments."""
    merged: dict[str, str] = {}
    for target in targets:
        merged.update(target.child_env())
    return merged
