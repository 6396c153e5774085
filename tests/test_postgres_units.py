"""The Postgres connector's pieces that need no server: the binary COPY plans, the
client-side conversions that name a bad value's row, the stall guard, and COPY's error
positions."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.postgres.binary import BinaryEncoder
from txsink.connectors.postgres.casts import Unsendable, plan_column
from txsink.connectors.postgres.errors import copy_position
from txsink.connectors.postgres.stall import Stall, Timeouts
from txsink.errors import RetryableError, WriteError


@pytest.mark.parametrize(
    ("source", "target", "how", "wire"),
    [
        (pa.int16(), "bigint", "cast", pa.int64()),
        (pa.int32(), "numeric(10,2)", "cast", pa.decimal128(38, 0)),
        (pa.decimal128(12, 3), "numeric(12,3)", "cast", pa.decimal128(12, 3)),
        (pa.float32(), "numeric", "cast", pa.decimal128(38, 16)),
        (pa.string(), "character varying(3)", "cast", pa.string()),
        (pa.string(), "uuid", "uuid", pa.binary()),
        (pa.string(), "cidr", "cidr", pa.binary()),
        (pa.date32(), "timestamp with time zone", "cast", pa.timestamp("us", tz="UTC")),
        (pa.timestamp("us"), "timestamp(3) with time zone", "cast", pa.timestamp("us", tz="UTC")),
        (pa.list_(pa.int8()), "smallint[]", "cast", pa.list_(pa.int16())),
        (pa.struct([("a", pa.int64())]), "text", "json", pa.string()),
        (pa.null(), "public.citext", "cast", pa.string()),
        (pa.null(), "integer[]", "cast", pa.list_(pa.int32())),
    ],
)
def test_plans(source: pa.DataType, target: str, how: str, wire: pa.DataType) -> None:
    plan = plan_column("c", source, target)
    assert (plan.how, plan.wire) == (how, wire)


def test_jsonb_is_sent_in_its_wire_form() -> None:
    assert plan_column("c", pa.string(), "jsonb").jsonb
    assert plan_column("c", pa.map_(pa.string(), pa.int64()), "jsonb").jsonb
    assert not plan_column("c", pa.string(), "json").jsonb


@pytest.mark.parametrize(
    ("source", "target", "reason"),
    [
        (pa.list_(pa.string()), "character varying[]", "element type of the Arrow values"),
        (pa.list_(pa.timestamp("us", tz="UTC")), "timestamp with time zone[]", "element type"),
        (pa.string(), "integer", "is integer, which cannot take"),
        (pa.int64(), "integer", "cannot take"),
        (pa.string(), "money", "cannot take"),
        (pa.list_(pa.string()), "bigint[]", "whose elements cannot take"),
    ],
)
def test_unsendable(source: pa.DataType, target: str, reason: str) -> None:
    with pytest.raises(Unsendable, match=reason) as info:
        plan_column("c", source, target)
    assert info.value.fix


def _encode(source: pa.DataType, target: str, values: list[Any], first_row: int = 0) -> bytes:
    plan = plan_column("v", source, target)
    batch = pa.RecordBatch.from_arrays([pa.array(values, source)], names=["v"])
    encoder = BinaryEncoder([plan])
    # pgpq keeps small outputs until it has a chunk's worth: finish() gives the rest.
    return encoder.header() + encoder.encode(batch, first_row) + encoder.finish()


@pytest.mark.parametrize(
    ("source", "target", "values", "row"),
    [
        (pa.float64(), "numeric", [1.5, None, 2.0, float("nan")], 3),
        (pa.float64(), "numeric(5,2)", [float("inf"), 1.0], 0),
        (pa.string(), "uuid", [None, "12345678123456781234567812345678", "nope"], 2),
        (pa.string(), "inet", ["10.0.0.1", "10.0.0.256"], 1),
        (pa.string(), "cidr", ["10.0.0.0/8", "10.0.0.1/8"], 1),
        (pa.list_(pa.float64()), "jsonb", [[1.0], [float("nan")]], 1),
    ],
)
def test_a_bad_value_is_named_by_row_and_column(
    source: pa.DataType, target: str, values: list[Any], row: int
) -> None:
    with pytest.raises(WriteError) as info:
        _encode(source, target, values, first_row=100)
    assert (info.value.row, info.value.column) == (100 + row, "v")
    assert "nothing of this epoch was committed" in str(info.value)


def test_inet_and_uuid_bytes() -> None:
    # family 2 (IPv4), 24 bits, not cidr, 4 bytes; then the address
    data = _encode(pa.string(), "inet", ["10.1.2.3/24"])
    assert bytes([2, 24, 0, 4, 10, 1, 2, 3]) in data
    data = _encode(pa.string(), "uuid", ["{12345678-1234-5678-9ABC-DEF012345678}"])
    assert bytes.fromhex("12345678123456789abcdef012345678") in data


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ("COPY t, line 3, column key", (2, "key")),
        ('COPY t, line 3, column key: "too, long"', (2, "key")),
        ("COPY t, line 2", (1, None)),
        ("JSON data, line 1: [1,\nCOPY t, line 9, column my col", (8, "my col")),
        ("SQL statement", (None, None)),
    ],
)
def test_copy_position(context: str, expected: tuple[int | None, str | None]) -> None:
    assert copy_position(context) == expected


class _Conn:
    """What the stall guard uses of a connection: its socket and close()."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.closed = True


def test_stall_guard_ends_a_wait_that_never_gets_an_answer() -> None:
    mine, peer = socket.socketpair()
    conn = _Conn(mine)
    start = time.monotonic()
    with (
        pytest.raises(RetryableError, match=r"did not answer for 0\.3 s during COPY"),
        Stall(conn, 0.3).guard("COPY"),  # type: ignore[arg-type]
    ):
        mine.recv(1)  # the peer never writes: only the guard ends this
    assert time.monotonic() - start < 5 and conn.closed
    peer.close()
    mine.close()


def test_stall_guard_leaves_an_answer_in_time_alone() -> None:
    mine, peer = socket.socketpair()
    conn = _Conn(mine)
    threading.Timer(0.05, lambda: peer.send(b"x")).start()
    with Stall(conn, 2.0).guard("commit"):  # type: ignore[arg-type]
        assert mine.recv(1) == b"x"
    time.sleep(0.1)
    peer.send(b"y")
    assert mine.recv(1) == b"y" and not conn.closed  # the socket was left working
    peer.close()
    mine.close()


def test_timeouts_as_libpq_options() -> None:
    options = Timeouts(connect_s=0.5, tcp_user_timeout_ms=5000, keepalives_idle_s=9)
    assert options.connect_options() == {
        "connect_timeout": 2,
        "keepalives": 1,
        "keepalives_idle": 9,
        "keepalives_interval": 3,
        "keepalives_count": 3,
        "tcp_user_timeout": 5000,
    }
    assert Timeouts(keepalives_idle_s=None, tcp_user_timeout_ms=None).connect_options() == {
        "connect_timeout": 10
    }


def test_a_staged_handle_round_trips_through_the_log_format() -> None:
    """The staging commit's handle carries what a new driver needs (its staging table, the
    columns, the upsert key) and comes back equal from the log's JSON."""
    import json

    from txsink.connectors.postgres import StagedHandle
    from txsink.handles import dump_handle, load_handle
    from txsink.txid import TxnId

    handle = StagedHandle(
        txn=TxnId("app", "pg", 3, 0, 1, 7),
        rows=10,
        nbytes=99,
        staging=("public", "txsink_staging_abc"),
        columns=("id", "name"),
        key=("id",),
    )
    doc = json.loads(json.dumps(dump_handle(handle)))
    assert doc["serializer"] == "postgres.staged" and doc["version"] == 1
    assert load_handle(doc) == handle


def test_the_commit_option_is_checked_and_shown() -> None:
    from txsink.connectors.postgres import PostgresSink

    with pytest.raises(ValueError, match="commit must be 'auto', '2pc' or 'staging'"):
        PostgresSink("postgresql://u:secret@h/db", "t", uid="pg", commit="xa")  # type: ignore[arg-type]
    sink = PostgresSink("postgresql://u:secret@h/db", "t", uid="pg", commit="staging")
    assert sink.protocol == "staging" and "commit='staging'" in repr(sink)
    assert "secret" not in repr(sink)
    assert PostgresSink("postgresql://h/db", "t", uid="pg").protocol is None  # auto: at check
