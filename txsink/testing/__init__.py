"""Chaos testing for txsink pipelines: fault plans, a restarting run, a verdict per sink.

Quick use::

    from txsink.testing import ChaosPlan, FilesVerifier, run_chaos

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
See docs/testing-recovery.md; for several targets watched during a run (the cross-system
observer) and callbacks at crash points, docs/reliability.md.
"""

from txsink.testing.chaos import ChaosReport, format_table, run_chaos
from txsink.testing.hooks import HookPlan, PointHooks
from txsink.testing.observer import (
    EpochVisibility,
    KafkaTarget,
    Observer,
    ObserverReport,
    PostgresTarget,
    S3ListingTarget,
    S3ManifestTarget,
    Snapshot,
    Target,
    input_epochs,
)
from txsink.testing.plan import DEFAULT_MODES, DEFAULT_POINTS, ChaosPlan
from txsink.testing.soak import CONNECTORS, SoakResult, available_connectors, soak
from txsink.testing.verifiers import (
    FilesVerifier,
    IdsVerifier,
    KafkaVerifier,
    PostgresVerifier,
    S3Verifier,
    SinkVerifier,
    verify,
)

__all__ = [
    "CONNECTORS",
    "DEFAULT_MODES",
    "DEFAULT_POINTS",
    "ChaosPlan",
    "ChaosReport",
    "EpochVisibility",
    "FilesVerifier",
    "HookPlan",
    "IdsVerifier",
    "KafkaTarget",
    "KafkaVerifier",
    "Observer",
    "ObserverReport",
    "PointHooks",
    "PostgresTarget",
    "PostgresVerifier",
    "S3ListingTarget",
    "S3ManifestTarget",
    "S3Verifier",
    "SinkVerifier",
    "Snapshot",
    "SoakResult",
    "Target",
    "available_connectors",
    "format_table",
    "input_epochs",
    "run_chaos",
    "soak",
    "verify",
]
