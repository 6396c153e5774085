"""Spark: everything that touches Spark.

How a DataFrame becomes one epoch of the protocol (:mod:`txsink.spark.epoch`: the query's
checks, the layout of its partitions, the schema check, the pre-commit job or the single
pass), the partition jobs and the query's identity, the stability of a replayed plan, what
travels to Spark Connect, Spark's own log records of a txsink error, and local sessions
(with their JVM class-data archive).

May import: the base API, the kit, observe and the protocol. Not the operator tools, the
faces, ``testing`` or ``cli``: the Coordinator composes this room with the protocol, never
the reverse.
"""
