"""The targets of the cross-system tests: a fresh target of every registered connector that
needs a server (Kafka, Postgres and S3 today), and one coordinator over them.

Shared by ``test_cross_system.py`` (crash matrix, kill-driver, network faults),
``test_takeover.py`` (zombies, rescale), ``test_savepoint_targets.py``,
``test_inspect_targets.py`` and ``test_operate_targets.py``; the ``cross`` fixture in
``conftest.py`` makes one per test. Every target is made, built, read back and watched
through its connector's testing adapter: nothing here knows a connector.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txsink.protocol.faults import FaultPlan
from txsink.testing.observer import Observer, ObserverReport
from txsink.testing.targets import RunTarget, child_env, new_targets
from txsink.testing.verifiers import Verdict, assert_audited, verify

ROWS, FILES = 600, 4


@dataclass
class Cross:
    """One target per connector (in commit order) for one test, and the services behind them.

    :meth:`route` sends one connector's sink through a proxy: the observer and the
    verifiers always read the target directly.
    """

    targets: dict[str, RunTarget]
    services: dict[str, Any]
    tmp: Path
    _made: list[RunTarget] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        connectors: Sequence[str],
        services: Mapping[str, Any],
        tmp: Path,
        options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Cross:
        """``options``: per connector, its adapter's ``new_target`` options (a variant)."""
        env: dict[str, str] = {}
        for service in services.values():
            env.update(service.env())
        made = new_targets(connectors, tmp, tag="xs", env=env, options=options)
        return cls({t.connector: t for t in made}, dict(services), tmp, list(made))

    @property
    def log(self) -> str:
        return str(self.tmp / "txlog")

    @property
    def uids(self) -> dict[str, str]:
        return {name: t.uid for name, t in self.targets.items()}

    def rename(self, name: str, uid: str) -> None:
        """Configure connector ``name``'s sink with another uid (``txsink state rename-uid``)."""
        self.targets[name].spec["uid"] = uid

    def route(self, name: str, address: str) -> None:
        """Build connector ``name``'s sink against ``address`` (its service's proxy)."""
        (service,) = [self.services[s] for s in self.targets[name].adapter.services[:1]]
        self.targets[name] = self.targets[name].through(**service.env(address))

    def single_pass_targets(self) -> list[RunTarget]:
        """A fresh target of each connector's first single-pass variant (a sink that commits
        in its tasks), with a uid of its own (``<connector>-<variant>``): a coordinator with
        one of them runs every epoch in one pass, the other sinks' handles in the same votes.
        Dropped with the others; not in :attr:`targets` (the observer's views)."""
        made: list[RunTarget] = []
        for name, target in self.targets.items():
            found = target.adapter
            variant = next((v for v in found.variants if v in found.single_pass_variants), None)
            if variant is None:
                continue
            options = {**found.variants[variant], "uid": f"{name}-{variant}"}
            made += new_targets(
                [name], self.tmp, tag=f"xs-{variant}", env=target.env, options={name: options}
            )
        self._made += made
        return made

    def sinks(self) -> list[Any]:
        return [t.sink() for t in self.targets.values()]

    def coordinator(self, faults: FaultPlan | None = None, **options: Any) -> Any:
        from txsink import Coordinator

        return Coordinator(self.sinks(), log=self.log, faults=faults, **options)

    def specs(self) -> list[dict[str, Any]]:
        """The same sinks for ``txsink.testing.pipelines`` in a child process."""
        return [t.spec for t in self.targets.values()]

    def child_env(self) -> dict[str, str]:
        return child_env(self.targets.values())

    def observer(self, expected: dict[int, list[int]]) -> Observer:
        views = [view for t in self.targets.values() for view in t.observer_targets()]
        return Observer(views, expected, interval=0.075)

    def verdicts(self, rows: int) -> dict[str, Verdict]:
        return {
            name: verify(t.verifier(range(rows), log=self.log)) for name, t in self.targets.items()
        }

    def assert_exactly_once(self, rows: int, report: ObserverReport) -> None:
        verdicts = self.verdicts(rows)
        bad = {name: v for name, v in verdicts.items() if not v.ok}
        assert not bad, f"not exactly-once: {bad}\n{report.table()}"
        report.assert_ok()
        assert_audited(self.log, self.sinks())  # every epoch x target, rows checksummed

    def drop(self) -> None:
        for target in self._made:
            target.adapter.drop_target(target.spec, target.env)


def observed(
    cross: Cross, run: Callable[[], None], *, expected: dict[int, list[int]]
) -> ObserverReport:
    observer = cross.observer(expected).start()
    try:
        run()
    finally:
        report = observer.stop()
    return report
