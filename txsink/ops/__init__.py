"""Operator tools over a txsink log: what people run around a pipeline, not inside it.

Checks before the start (``txsink check``), recovery and aborts by hand, state upgrades
(renaming a sink uid), savepoints and Spark's checkpoint beside them, the log as tables
and its HTML report (``txsink inspect``), and following a log from another process.

May import: the base API, the kit, observe, the protocol and spark. Not the faces,
``testing`` or ``cli``: the Coordinator's operator methods
(:class:`~txsink.ops.operator.Operations`) live here and the face inherits them.
"""
