"""The run's context every writer, check and extra of the Postgres benchmark shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import _bench


@dataclass
class Bench:
    """The Spark session, the server (DSN, the run's schema, JDBC's URL and properties), the
    CPU meter and the void runs' messages."""

    spark: Any
    dsn: str
    schema: str
    jdbc_url: str
    jdbc_properties: dict[str, str]
    workdir: Path
    cpu: _bench.CpuMeter
    void: list[str] = field(default_factory=list)

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def qualified(self, table: str) -> str:
        return f"{self.schema}.{table}"
