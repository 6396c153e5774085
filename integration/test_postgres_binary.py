"""PostgresSink's binary COPY against the real server: every widening the type table
lists, the combinations refused at the check, and bad values named by row and column
(on the client before sending, or by the server) with nothing of the epoch visible."""

from __future__ import annotations

import datetime as dt
import decimal
import ipaddress
import uuid
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.postgres import PostgresSink
from txsink.errors import ConfigurationError, WriteError
from txsink.txid import TxnId

pytestmark = pytest.mark.postgres


def _rows(postgres: Any, query: str) -> list[tuple[Any, ...]]:
    with postgres.connect() as conn:
        return conn.execute(query).fetchall()  # type: ignore[no-any-return]


def _prepared(postgres: Any, uid: str) -> list[str]:
    return [g for (g,) in _rows(postgres, "SELECT gid FROM pg_prepared_xacts") if f".{uid}." in g]


def _table(postgres: Any, ddl: str, tag: str = "bin") -> tuple[str, str]:
    schema = postgres.new_schema(tag)
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {schema}.t ({ddl})")
    return f"{schema}.t", schema


def _write(
    postgres: Any, name: str, uid: str, batches: list[pa.RecordBatch], **options: Any
) -> None:
    sink = PostgresSink(postgres.dsn, name, uid=uid, **options)
    sink.check(batches[0].schema, "app")
    open_ = sink.begin(TxnId("app", uid, 0, 0, 0, 0), batches[0].schema)
    for batch in batches:
        sink.write(open_, batch)
    sink.commit(sink.prepare(open_))


AT = dt.datetime(2026, 11, 22, 1, 2, 3, 456789, tzinfo=dt.UTC)
U = uuid.UUID("12345678-1234-5678-9abc-def012345678")

# (Arrow type, value, column type, what the server gives back)
WIDENINGS = [
    (pa.int16(), 7, "bigint", 7),
    (pa.int8(), 7, "smallint", 7),
    (pa.int32(), 7, "numeric(10,2)", decimal.Decimal("7.00")),
    (pa.int64(), 7, "text", "7"),
    (pa.int32(), 7, "double precision", 7.0),
    (pa.float32(), 0.5, "double precision", 0.5),
    (pa.float64(), 1.25, "numeric(5,1)", decimal.Decimal("1.3")),  # rounded as from text
    (pa.float32(), 0.1, "numeric(5,2)", decimal.Decimal("0.10")),  # not 0.100000001...
    (pa.decimal128(12, 3), decimal.Decimal("12.345"), "numeric(12,3)", decimal.Decimal("12.345")),
    (pa.decimal128(12, 3), decimal.Decimal("1.5"), "text", "1.500"),
    (pa.bool_(), True, "text", "true"),
    (pa.string(), "abc", "varchar(5)", "abc"),
    (pa.string(), "abc", "char(4)", "abc "),
    (pa.string(), str(U).upper(), "uuid", U),
    (pa.string(), "{" + U.hex + "}", "uuid", U),
    (pa.string(), "10.1.2.3/16", "inet", ipaddress.ip_interface("10.1.2.3/16")),
    (pa.string(), "::1", "inet", ipaddress.ip_address("::1")),
    (pa.string(), "10.1.0.0/16", "cidr", ipaddress.ip_network("10.1.0.0/16")),
    (pa.string(), '{"a": [1, 2]}', "jsonb", {"a": [1, 2]}),
    (pa.string(), '{"a":1}', "json", {"a": 1}),
    (pa.binary(), b"\x00\xff", "bytea", b"\x00\xff"),
    (pa.date32(), dt.date(2026, 1, 2), "timestamp", dt.datetime(2026, 1, 2)),
    (pa.date32(), dt.date(2026, 1, 2), "timestamptz", dt.datetime(2026, 1, 2, tzinfo=dt.UTC)),
    (pa.date32(), dt.date(2026, 1, 2), "text", "2026-01-02"),
    (pa.timestamp("us", tz="UTC"), AT, "timestamp", AT.replace(tzinfo=None)),
    (pa.timestamp("us"), AT.replace(tzinfo=None), "timestamptz", AT),
    (pa.timestamp("us", tz="UTC"), AT, "timestamptz(3)", AT.replace(microsecond=457000)),
    (pa.list_(pa.int32()), [1, None, 3], "bigint[]", [1, None, 3]),
    (pa.list_(pa.string()), ["x", "y"], "text[]", ["x", "y"]),
    (pa.list_(pa.float64()), [1.5], "numeric[]", [decimal.Decimal("1.5")]),
    (pa.list_(pa.timestamp("us", tz="UTC")), [AT], "timestamp[]", [AT.replace(tzinfo=None)]),
    (pa.list_(pa.string()), ["x"], "jsonb", ["x"]),
    (pa.list_(pa.list_(pa.int64())), [[1], [2, 3]], "jsonb", [[1], [2, 3]]),
    (pa.struct([("x", pa.float64())]), {"x": 1.5}, "json", {"x": 1.5}),
    (pa.map_(pa.string(), pa.int64()), [("k", 1)], "jsonb", {"k": 1}),
    (pa.struct([("d", pa.date32())]), {"d": dt.date(2026, 1, 2)}, "text", '{"d":"2026-01-02"}'),
    (pa.null(), None, "integer", None),
    (pa.null(), None, "uuid[]", None),
]


@pytest.mark.parametrize(
    ("arrow", "value", "pg_type", "expected"),
    WIDENINGS,
    ids=[f"{a}->{p}" for a, _, p, _ in WIDENINGS],
)
def test_widening_round_trips(
    postgres: Any, arrow: pa.DataType, value: Any, pg_type: str, expected: Any
) -> None:
    name, uid = _table(postgres, f"id bigint, v {pg_type}")
    schema = pa.schema([("id", pa.int64()), ("v", arrow)])
    batch = pa.RecordBatch.from_pylist([{"id": 1, "v": value}, {"id": 2, "v": None}], schema)
    _write(postgres, name, uid, [batch])
    got = _rows(postgres, f"SELECT v FROM {name} ORDER BY id")
    assert got == [(expected,), (None,)]


@pytest.mark.parametrize(
    ("arrow", "pg_type", "message"),
    [
        (pa.list_(pa.string()), "varchar(3)[]", "element type of the Arrow values"),
        (pa.list_(pa.timestamp("us", tz="UTC")), "timestamptz[]", "element type"),
        (pa.list_(pa.string()), "bigint[]", "whose elements cannot take"),
        (pa.string(), "integer", "is integer, which cannot take"),
        (pa.binary(), "text", "is text, which cannot take"),
        (pa.struct([("x", pa.int64())]), "integer[]", "cannot take"),
        (pa.int64(), "integer", "cannot take"),
    ],
)
def test_unsendable_combinations_are_refused_at_the_check(
    postgres: Any, arrow: pa.DataType, pg_type: str, message: str
) -> None:
    name, uid = _table(postgres, f"id bigint, v {pg_type}")
    sink = PostgresSink(postgres.dsn, name, uid=uid)
    with pytest.raises(ConfigurationError, match=message) as info:
        sink.check(pa.schema([("id", pa.int64()), ("v", arrow)]), "app")
    assert (info.value.column, info.value.phase) == ("v", "check")
    assert _rows(postgres, f"SELECT count(*) FROM {name}") == [(0,)]


# (Arrow type, the bad value, column type, who refuses it, a word of the message)
BAD_VALUES = [
    (pa.float64(), float("nan"), "numeric", "client", "nan"),
    (pa.float64(), float("inf"), "numeric(10,2)", "client", "inf"),
    (pa.string(), "not-a-uuid", "uuid", "client", "not a uuid"),
    (pa.string(), "10.0.0.300", "inet", "client", "does not appear to be"),
    (pa.string(), "10.1.2.3/16", "cidr", "client", "host bits set"),
    (pa.struct([("x", pa.float64())]), {"x": float("nan")}, "jsonb", "client", "NaN"),
    (pa.int64(), 123456, "numeric(5,2)", "22003", "numeric field overflow"),
    (pa.string(), "[1,", "jsonb", "22P02", "json"),
    (pa.string(), "toolong", "varchar(3)", "22001", "too long"),
    (pa.string(), "<a", "xml", "2200N", "XML"),
]


@pytest.mark.parametrize(
    ("arrow", "bad", "pg_type", "who", "word"),
    BAD_VALUES,
    ids=[f"{p}-{w}" for _, _, p, w, _ in BAD_VALUES],
)
def test_bad_value_names_row_and_column_and_leaves_nothing(
    postgres: Any, arrow: pa.DataType, bad: Any, pg_type: str, who: str, word: str
) -> None:
    name, uid = _table(postgres, f"id bigint, v {pg_type}")
    schema = pa.schema([("id", pa.int64()), ("v", arrow)])
    good = pa.RecordBatch.from_pylist([{"id": i, "v": None} for i in range(5)], schema)
    worse = pa.RecordBatch.from_pylist(
        [{"id": 5, "v": None}, {"id": 6, "v": None}, {"id": 7, "v": bad}], schema
    )
    sink = PostgresSink(postgres.dsn, name, uid=uid)
    sink.check(schema, "app")
    open_ = sink.begin(TxnId("app", uid, 0, 0, 2, 0), schema)
    with pytest.raises(WriteError, match=word) as info:
        sink.write(open_, good)
        sink.write(open_, worse)
        sink.prepare(open_)
    err = info.value
    assert (err.sink_uid, err.partition, getattr(err.row, "offset", None), err.column) == (
        uid,
        2,
        7,
        "v",
    )
    assert "nothing of this epoch was committed" in str(err)
    if who != "client":
        assert who in str(err)  # the server's SQLSTATE
    sink.discard(open_)
    assert _rows(postgres, f"SELECT count(*) FROM {name}") == [(0,)]
    assert _prepared(postgres, uid) == []


def test_upsert_fills_the_stage_by_binary_copy(postgres: Any) -> None:
    """bytea, an array and a nested column through the stage table and ON CONFLICT."""
    name, uid = _table(
        postgres, "id bigint PRIMARY KEY, blob bytea, tags text[], attrs jsonb, n numeric"
    )
    schema = pa.schema(
        [
            ("id", pa.int32()),  # widened to the bigint key
            ("blob", pa.binary()),
            ("tags", pa.list_(pa.string())),
            ("attrs", pa.struct([("k", pa.int64())])),
            ("n", pa.int64()),
        ]
    )

    def batch(ids: range, tag: str) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist(
            [{"id": i, "blob": bytes([i]), "tags": [tag], "attrs": {"k": i}, "n": i} for i in ids],
            schema,
        )

    _write(
        postgres,
        name,
        uid,
        [batch(range(4), "a"), batch(range(2, 6), "b")],
        mode="upsert",
        key=["id"],
    )
    got = _rows(postgres, f"SELECT id, blob, tags, attrs, n FROM {name} ORDER BY id")
    assert got == [
        (i, bytes([i]), ["a" if i < 2 else "b"], {"k": i}, decimal.Decimal(i)) for i in range(6)
    ]
