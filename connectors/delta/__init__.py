"""Delta Lake connector: data files prepared by the tasks, one Delta commit per epoch with the
app's transaction version in the log itself.

See :mod:`txsink.connectors.delta.sink` and docs/connectors/delta.md.
"""

from txsink.connectors.delta.handles import DeltaFile, DeltaHandle
from txsink.connectors.delta.sink import DeltaSink

__all__ = ["DeltaFile", "DeltaHandle", "DeltaSink"]
