"""PostgreSQL connector: real two-phase commit with COPY, append and upsert.

See :mod:`txsink.connectors.postgres.sink` and docs/connectors/postgres.md.
"""

from txsink.connectors.postgres.errors import redact_dsn
from txsink.connectors.postgres.sink import PgHandle, PostgresSink
from txsink.connectors.postgres.types import arrow_to_pg_type

__all__ = ["PgHandle", "PostgresSink", "arrow_to_pg_type", "redact_dsn"]
