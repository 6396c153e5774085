"""The three targets of the cross-system tests: a Kafka topic, a Postgres table and an S3
prefix, and one coordinator over them (Kafka in WAL mode + Postgres + S3).

Shared by ``test_cross_system.py`` (crash matrix, kill-driver, network faults),
``test_takeover.py`` (zombies, rescale), ``test_savepoint_targets.py``,
``test_inspect_targets.py`` and ``test_operate_targets.py``; the ``cross`` fixture in
``conftest.py`` makes one per test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import sql

from txsink.faults import FaultPlan
from txsink.testing.observer import (
    KafkaTarget,
    Observer,
    ObserverReport,
    PostgresTarget,
    S3ListingTarget,
    S3ManifestTarget,
)
from txsink.testing.verifiers import KafkaVerifier, PostgresVerifier, S3Verifier, verify
from txsink.verify import Verdict

ROWS, FILES = 600, 4
#: The order the coordinator commits the sinks in. Postgres first: ``during_commit`` (after
#: the first handle) then leaves one Postgres partition of the epoch visible and nothing
#: elsewhere, the hardest case for "eventually everywhere"; Kafka (whose WAL-mode handles
#: commit in ``finish_epoch``) last.
ORDER = ("postgres", "s3", "kafka")
DDL = "CREATE TABLE {} (id bigint, key text, amount double precision, payload text)"


# -- the three targets -------------------------------------------------------------------


@dataclass
class Cross:
    """Kafka topic + Postgres table + S3 prefix for one test, and how to reach each.

    ``via`` replaces one target's address (a proxy): the sinks use it, the observer and
    the verifiers never do.
    """

    kafka: Any
    postgres: Any
    s3: Any
    tmp: Path
    topic: str = ""
    table: str = ""
    bucket: str = ""
    uids: dict[str, str] = field(default_factory=dict)
    via: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, kafka: Any, postgres: Any, s3: Any, tmp: Path) -> Cross:
        cross = cls(kafka, postgres, s3, tmp)
        cross.topic = kafka.new_topic(3)
        schema = postgres.new_schema("xs")
        with postgres.connect() as conn:
            conn.execute(sql.SQL(DDL).format(sql.Identifier(schema, "events")))
        cross.table = f"{schema}.events"
        cross.bucket = s3.new_bucket()
        tag = uuid.uuid4().hex[:8]
        cross.uids = {"kafka": f"k{tag}", "postgres": schema, "s3": f"s{tag}"}
        return cross

    @property
    def wal(self) -> Path:
        return self.tmp / "wal"

    @property
    def log(self) -> str:
        return str(self.tmp / "txlog")

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/out"

    def s3_options(self, endpoint: str | None = None, **config: Any) -> dict[str, Any]:
        from botocore.config import Config

        options: dict[str, Any] = {
            "s3": {"addressing_style": "path"},
            "retries": {"max_attempts": 2, "mode": "standard"},
            "connect_timeout": 2,
            "read_timeout": 3,
        }
        options.update(config)
        return {
            "endpoint_url": endpoint or self.s3.endpoint,
            "aws_access_key_id": self.s3.access_key,
            "aws_secret_access_key": self.s3.secret_key,
            "region_name": self.s3.region,
            "config": Config(**options),
        }

    def sinks(self) -> list[Any]:
        from txsink.connectors.kafka import KafkaSink
        from txsink.connectors.postgres import PostgresSink
        from txsink.connectors.s3 import S3Sink

        built = {
            "kafka": KafkaSink(
                self.via.get("kafka", self.kafka.bootstrap),
                self.topic,
                uid=self.uids["kafka"],
                wal=self.wal,
                key="key",
                shards=2,
                mode="wal",
                timeout_s=10.0,
            ),
            "postgres": PostgresSink(
                self.via.get("postgres", self.postgres.dsn),
                self.table,
                uid=self.uids["postgres"],
                connect_kwargs={"connect_timeout": 5},
            ),
            "s3": S3Sink(
                self.url,
                self.uids["s3"],
                client_options=self.s3_options(self.via.get("s3")),
            ),
        }
        return [built[name] for name in ORDER]

    def coordinator(self, faults: FaultPlan | None = None) -> Any:
        from txsink import Coordinator

        return Coordinator(self.sinks(), log=self.log, faults=faults)

    def specs(self) -> list[dict[str, Any]]:
        """The same sinks for ``txsink.testing.pipelines`` in a child process."""
        specs = {
            "kafka": {
                "kind": "kafka",
                "topic": self.topic,
                "uid": self.uids["kafka"],
                "wal": str(self.wal),
            },
            "postgres": {"kind": "postgres", "table": self.table, "uid": self.uids["postgres"]},
            "s3": {"kind": "s3", "url": self.url, "uid": self.uids["s3"]},
        }
        return [specs[name] for name in ORDER]

    def child_env(self) -> dict[str, str]:
        return {
            "TXSINK_TEST_KAFKA": self.kafka.bootstrap,
            "TXSINK_TEST_PG_DSN": self.postgres.dsn,
            "AWS_ACCESS_KEY_ID": self.s3.access_key,
            "AWS_SECRET_ACCESS_KEY": self.s3.secret_key,
            "AWS_ENDPOINT_URL_S3": self.s3.endpoint,
            "AWS_DEFAULT_REGION": self.s3.region,
        }

    def observer(self, expected: dict[int, list[int]]) -> Observer:
        direct = self.s3_options()
        return Observer(
            [
                KafkaTarget(self.kafka.bootstrap, self.topic),
                PostgresTarget(self.postgres.dsn, self.table),
                S3ManifestTarget(self.url, uid=self.uids["s3"], client_options=direct),
                S3ListingTarget(self.url, client_options=direct),
                KafkaTarget(self.kafka.bootstrap, self.topic, isolation="read_uncommitted"),
            ],
            expected,
            interval=0.075,
        )

    def verdicts(self, rows: int) -> dict[str, Verdict]:
        expected = range(rows)
        return {
            "kafka": verify(
                KafkaVerifier(self.kafka.bootstrap, self.topic, expected, wal=str(self.wal))
            ),
            "postgres": verify(
                PostgresVerifier(
                    self.postgres.dsn, self.table, expected, self.uids["postgres"], log=self.log
                )
            ),
            "s3": verify(
                S3Verifier(self.url, expected, self.uids["s3"], client_options=self.s3_options())
            ),
        }

    def assert_exactly_once(self, rows: int, report: ObserverReport) -> None:
        verdicts = self.verdicts(rows)
        bad = {name: v for name, v in verdicts.items() if not v.ok}
        assert not bad, f"not exactly-once: {bad}\n{report.table()}"
        report.assert_ok()


def observed(
    cross: Cross, run: Callable[[], None], *, expected: dict[int, list[int]]
) -> ObserverReport:
    observer = cross.observer(expected).start()
    try:
        run()
    finally:
        report = observer.stop()
    return report
