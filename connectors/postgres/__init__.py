"""PostgreSQL connector: COPY, append and upsert, committed with PostgreSQL's two-phase
commit or, on a server without prepared transactions, through a staging table.

See :mod:`txsink.connectors.postgres.sink` and docs/connectors/postgres.md.
"""

from txsink.connectors.postgres.errors import redact_dsn
from txsink.connectors.postgres.sink import PgHandle, PostgresSink
from txsink.connectors.postgres.stagecommit import StagedHandle
from txsink.connectors.postgres.types import arrow_to_pg_type

__all__ = ["PgHandle", "PostgresSink", "StagedHandle", "arrow_to_pg_type", "redact_dsn"]
