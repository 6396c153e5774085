"""The kit: plumbing shared by the core and the connectors, with no part in the protocol.

Epoch manifests (and the schema each records: ``evolving``) and the file formats (Parquet,
JSON lines, CSV) of the connectors that write files or objects, Arrow rows as JSON, short
text for people (times, sizes), and which process is what (``/proc``, signal 0).

May import: the base API at the top of ``txsink/`` (``errors``, ``rowref``, ``store``...)
and the standard library. Nothing of the protocol, Spark, the operator tools or the faces:
a connector that imports the kit pulls no coordinator in. Private to txsink's own
connectors and core (the API may change between releases).
"""
