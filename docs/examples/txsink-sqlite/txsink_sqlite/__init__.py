"""txsink-sqlite: exactly-once into a SQLite table (the worked example of writing a connector)."""

from txsink_sqlite.sink import SqliteHandle, SqliteSink

__all__ = ["SqliteHandle", "SqliteSink"]
