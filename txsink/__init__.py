"""txsink: exactly-once, transactional sinks for Spark Structured Streaming.

Quick use::

    from txsink import Coordinator
    from txsink.connectors.files import FilesSink

    coordinator = Coordinator([FilesSink("/data/out", uid="events")], log="/data/txlog")
    coordinator.check(df)   # before the start: every sink's checks, against its target
    df.writeStream.foreachBatch(coordinator).option("checkpointLocation", ...).start()
"""

from txsink import _moved
from txsink._version import __version__
from txsink.coordinator import Coordinator
from txsink.errors import (
    CheckpointMismatchError,
    CommitError,
    ConfigurationError,
    EpochAbortedError,
    FencedError,
    HandleFormatError,
    InjectedFault,
    LogError,
    NonDeterministicReplayError,
    NonRestoredStateError,
    RetryableError,
    TxsinkError,
    UnsupportedQueryError,
    WriteError,
)
from txsink.handles import Handle, register_handle
from txsink.observe.logs import configure_logging
from txsink.ops.follow import follow
from txsink.ops.precheck import CheckResult
from txsink.protocol.epoch import EpochResult
from txsink.protocol.faults import CrashPoint, Fault, FaultMode, FaultPlan
from txsink.protocol.log import TxLog, open_log
from txsink.sink import TwoPhaseCommitSink, check
from txsink.txid import TxnId

_moved.install()  # the old paths of modules that moved into the rooms still import

__all__ = [
    "CheckResult",
    "CheckpointMismatchError",
    "CommitError",
    "ConfigurationError",
    "Coordinator",
    "CrashPoint",
    "EpochAbortedError",
    "EpochResult",
    "Fault",
    "FaultMode",
    "FaultPlan",
    "FencedError",
    "Handle",
    "HandleFormatError",
    "InjectedFault",
    "LogError",
    "NonDeterministicReplayError",
    "NonRestoredStateError",
    "RetryableError",
    "TwoPhaseCommitSink",
    "TxLog",
    "TxnId",
    "TxsinkError",
    "UnsupportedQueryError",
    "WriteError",
    "__version__",
    "check",
    "configure_logging",
    "follow",
    "open_log",
    "register_handle",
]
