"""The Kafka audit's pieces that need no broker: the epoch header the records carry, and the
row digest read back from records (the broker half: integration/test_audit_kafka.py)."""

from __future__ import annotations

import pyarrow as pa

from txsink.audit.digest import digest_batch
from txsink.connectors.kafka.audit import digest_columns
from txsink.connectors.kafka.records.format import EPOCH_HEADER, RecordFormat

ROWS = pa.RecordBatch.from_pydict(
    {"key": ["a", "b", None], "id": [1, 2, 3], "name": ["x", None, "z"], "ok": [True, False, None]}
)


def _records(
    fmt: RecordFormat, batch: pa.RecordBatch = ROWS
) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    records = fmt.encode(batch, 0, 0, app="app", epoch=7)
    headers = records.column(4).to_pylist()
    return [
        (0, k, v, [(h["key"], h["value"]) for h in hs or ()])
        for k, v, hs in zip(
            records.column(2).to_pylist(), records.column(3).to_pylist(), headers, strict=True
        )
    ]


def test_the_epoch_header_is_added_last_and_only_when_asked() -> None:
    tagged = RecordFormat(uid="u", topic="t", key="key", epoch_header=True)
    assert [r[3] for r in _records(tagged)] == [[(EPOCH_HEADER, b"app/u/7")]] * 3
    plain = RecordFormat(uid="u", topic="t", key="key")
    assert [r[3] for r in _records(plain)] == [[]] * 3
    # The partition is not in it: a replay numbering its partitions otherwise encodes the same.
    assert tagged.encode(ROWS, 0, 0, app="app", epoch=7) == tagged.encode(
        ROWS, 1, 0, app="app", epoch=7
    )
    with_headers = ROWS.append_column(
        "h", pa.array([[("a", b"1")], None, []], pa.map_(pa.string(), pa.binary()))
    )
    fmt = RecordFormat(uid="u", topic="t", key="key", headers="h", epoch_header=True)
    ours = (EPOCH_HEADER, b"app/u/7")
    assert [r[3] for r in _records(fmt, with_headers)] == [[("a", b"1"), ours], [ours], [ours]]


def test_the_digest_of_json_records_is_the_pre_commits() -> None:
    fmt = RecordFormat(uid="u", topic="t", key="key", epoch_header=True)
    expected = digest_batch(ROWS)
    found, left_out = digest_columns(_records(fmt), fmt, expected)
    assert left_out == []
    assert found == expected  # every column read back: the whole row digest


def test_a_changed_value_leaves_its_column_out_and_named() -> None:
    fmt = RecordFormat(uid="u", topic="t", key="key", value="name")
    expected = digest_batch(ROWS.select(["key", "name"]))
    records = _records(fmt)
    assert digest_columns(records, fmt, expected) == (expected, [])
    records[0] = (0, records[0][1], b"changed", records[0][3])
    found, left_out = digest_columns(records, fmt, expected)
    assert left_out == ["name"]
    assert found is not None and set(found.cols) == {"key"}
