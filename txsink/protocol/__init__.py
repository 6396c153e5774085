"""The protocol: two-phase commit per epoch, and nothing of Spark.

The epoch's steps (:class:`~txsink.protocol.epoch.EpochProtocol`: recover, skip,
pre-commit in rounds or in a single pass, decide, commit, void and abort), the txsink log
and its records, recovery's plan and its actions, the driver lease, the crash points, and
the executor's side of an epoch (a partition task's plan and its acks, a task's error).

May import: the base API, the kit and observe. Never ``pyspark`` (not even for types:
the Spark side hands the protocol callables and :class:`~txsink.contract.EpochData`), and
nothing of ``spark``, ``ops``, the faces, ``testing`` or ``cli``. tests/test_structure.py
checks it, lazy and ``TYPE_CHECKING`` imports included.
"""
