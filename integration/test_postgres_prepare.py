"""What PostgreSQL checks at ``PREPARE TRANSACTION`` and what it leaves for ``COMMIT PREPARED``.

The pre-commit's ``PREPARE TRANSACTION`` is before the decision; ``COMMIT PREPARED`` after
it. A constraint checked only at ``COMMIT PREPARED`` would fail a decided epoch. Written down
here against the real server (docs/reliability.md, "What can fail after the decision"):
constraints declared ``DEFERRABLE INITIALLY DEFERRED`` and deferred constraint triggers run
at ``PREPARE TRANSACTION``, which fails and leaves nothing prepared; through the sink the
epoch is refused in the pre-commit, naming the SQLSTATE.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.postgres import PostgresSink
from txsink.errors import TxsinkError
from txsink.txid import TxnId

pytestmark = pytest.mark.postgres

DEFERRED_FK = """
CREATE TABLE {s}.parent (id bigint PRIMARY KEY);
CREATE TABLE {s}.child (id bigint, parent bigint
    REFERENCES {s}.parent (id) DEFERRABLE INITIALLY DEFERRED);
CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN IF NEW.id < 0 THEN RAISE EXCEPTION 'negative id' USING ERRCODE = '23514';
       END IF; RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER refuse_negative AFTER INSERT ON {s}.child
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.refuse();
"""


def _prepared(postgres: Any, like: str) -> list[str]:
    with postgres.connect() as conn:
        rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (like,))
        return [str(r[0]) for r in rows]


@pytest.mark.parametrize(
    ("row", "sqlstate"),
    [((1, 99), "23503"), ((-1, None), "23514")],
    ids=["deferred-foreign-key", "deferred-constraint-trigger"],
)
def test_deferred_constraints_run_at_prepare_transaction(
    postgres: Any, row: tuple[int, int | None], sqlstate: str
) -> None:
    import psycopg

    schema = postgres.new_schema()
    with postgres.connect() as conn:
        conn.execute(DEFERRED_FK.format(s=schema))
    gid = f"txsink-test-{uuid.uuid4().hex[:10]}"
    conn = postgres.connect(autocommit=False)
    conn.tpc_begin(conn.xid(1, gid, "b"))
    conn.execute(f"INSERT INTO {schema}.child VALUES (%s, %s)", row)  # deferred: accepted
    with pytest.raises(psycopg.Error) as info:
        conn.tpc_prepare()
    conn.close()
    assert info.value.sqlstate == sqlstate
    assert _prepared(postgres, f"%{gid}%") == []


def test_the_sink_refuses_a_deferred_violation_before_the_decision(postgres: Any) -> None:
    schema = postgres.new_schema()
    with postgres.connect() as conn:
        conn.execute(DEFERRED_FK.format(s=schema))
    uid = schema
    sink = PostgresSink(postgres.dsn, f"{schema}.child", uid=uid)
    arrow = pa.schema([("id", pa.int64()), ("parent", pa.int64())])
    sink.check(arrow, "app")
    open_ = sink.begin(TxnId("app", uid, 0, 0, 0, 0), arrow)
    sink.write(open_, pa.RecordBatch.from_pylist([{"id": 1, "parent": 99}], schema=arrow))
    with pytest.raises(TxsinkError) as info:
        sink.prepare(open_)
    assert info.value.phase == "prepare" and "23503" in str(info.value)
    assert _prepared(postgres, f"%{uid}%") == []
    sink.release()
