"""Chaos testing for txsink pipelines: fault plans, a restarting run, a verdict per sink.

Quick use::

    from txsink.connectors.files.testing import FilesVerifier
    from txsink.testing import ChaosPlan, run_chaos

    plan = ChaosPlan.random(seed=7, epochs=3, partitions=2, n=2)
    report = run_chaos(
        "jobs/my_pipeline.py:run",          # runs one query to the end of its input
        plan,
        workdir=tmp,
        args={"out": str(tmp / "out")},     # the function's keyword arguments
        sinks_verifiers={"files": FilesVerifier(tmp / "out", expected=range(1000))},
    )
    print(report.table())
    report.assert_ok()

In pytest, the ``txsink`` plugin (installed with the package) gives the ``chaos_runner``
and ``chaos_workdir`` fixtures; from a shell, ``txsink chaos run`` and ``txsink chaos soak``.
Each connector's verifiers and observer views are in its testing module
(``txsink.connectors.<name>.testing``), reached generically through its adapter
(:mod:`txsink.testing.adapter`); :mod:`txsink.testing.contract` checks a connector's
sink contract against its real target. See docs/testing-recovery.md and, for several
targets watched during a run, docs/reliability.md.

May import: every room of txsink/ but ``cli/`` (the toolkit drives whole pipelines: the
faces, the operator tools, Spark sessions). Of the modules beside it, only this face and the
pytest plugin import ``chaos/``.

The modules, by job (each documented ``txsink.testing.<module>`` path is one of them)::

    the connector kit    adapter (what a connector registers for tests), contract (the
                         sink contract, without Spark), verifiers, observer (+ visibility,
                         history: a run watched from outside), targets (a run's targets)
    the chaos toolkit    inputs, pipelines, hooks, netproxy, disturb: what a run is made
                         of, and what users call directly; pytest_plugin
    chaos/               the chaos runs: run (run_chaos), plan, soak, soaklog, targetcrash
    tables               plain-text tables for every report

Imports run one way: ``chaos/`` uses the modules beside it, and none of them imports
``chaos/`` (but this face and the pytest plugin, which name its entry points).
"""

from txsink.spark.localspark import local_spark
from txsink.testing.adapter import ConnectorTesting, adapter, adapters
from txsink.testing.chaos import ChaosReport, run_chaos
from txsink.testing.chaos.plan import DEFAULT_MODES, DEFAULT_POINTS, ChaosPlan
from txsink.testing.chaos.soak import SoakResult, soak
from txsink.testing.chaos.targetcrash import ServerProcess, TargetControl, TargetCrashes, TargetKill
from txsink.testing.hooks import HookPlan, PointHooks
from txsink.testing.inputs import INPUT_SCHEMA, append_input, input_epochs, make_input
from txsink.testing.observer import (
    EpochVisibility,
    Observer,
    ObserverReport,
    Snapshot,
    Target,
)
from txsink.testing.tables import format_table
from txsink.testing.targets import RunTarget, available_connectors, new_targets
from txsink.testing.verifiers import IdsVerifier, SinkVerifier, assert_audited, verify

__all__ = [
    "DEFAULT_MODES",
    "DEFAULT_POINTS",
    "INPUT_SCHEMA",
    "ChaosPlan",
    "ChaosReport",
    "ConnectorTesting",
    "EpochVisibility",
    "HookPlan",
    "IdsVerifier",
    "Observer",
    "ObserverReport",
    "PointHooks",
    "RunTarget",
    "ServerProcess",
    "SinkVerifier",
    "Snapshot",
    "SoakResult",
    "Target",
    "TargetControl",
    "TargetCrashes",
    "TargetKill",
    "adapter",
    "adapters",
    "append_input",
    "assert_audited",
    "available_connectors",
    "format_table",
    "input_epochs",
    "local_spark",
    "make_input",
    "new_targets",
    "run_chaos",
    "soak",
    "verify",
]
