"""The chaos runs: a pipeline run under a fault plan until it is done, judged per sink.

``run`` (:func:`run_chaos` and its :class:`ChaosReport`: a restarting child process, the
crash and recovery times, a verdict per sink), ``plan`` (ChaosPlan: a reproducible list
of faults, declared or drawn from a seed), ``soak`` (many random plans in a row, across
connectors), ``soaklog`` (a soak's results file, resumable), ``targetcrash`` (the
``kill-target`` faults: a target's server killed, kept down, started again).

What a run uses and users call directly stays one floor up, at its documented paths:
the test input (:mod:`txsink.testing.inputs`), the generic pipelines
(:mod:`txsink.testing.pipelines`), crash-point hooks and network faults
(:mod:`txsink.testing.hooks`, :mod:`txsink.testing.netproxy`), the disturbances
(:mod:`txsink.testing.disturb`), and the connector kit the verdicts come from (adapters,
verifiers, observer, targets). Imports run one way: this room uses those; none of them
imports it (only the package face :mod:`txsink.testing` and the pytest plugin name it:
``tests/test_structure.py`` checks it).
"""

from txsink.testing.chaos.run import ChaosReport, run_chaos

__all__ = ["ChaosReport", "run_chaos"]
