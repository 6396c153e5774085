"""The row digest (:mod:`txsink.audit.digest`): what it equates, what it tells apart, and
pinned values of version 1 (a decision records them; an audit years later must compute the
same, so a change here is a new version, never an edit)."""

from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txsink.audit.digest import Digest, digest_batch, digest_rows


def _table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int32()),
            "s": ["a", None, "c"],
            "f": pa.array([1.5, -0.0, float("nan")], pa.float32()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1), None, dt.datetime(2024, 1, 2)], pa.timestamp("ns")
            ),
            "d": pa.array(
                [decimal.Decimal("1.50"), None, decimal.Decimal("0")], pa.decimal128(10, 2)
            ),
            "st": pa.array([{"x": 1, "y": "a"}, None, {"x": 2, "y": None}]),
            "l": pa.array([[1, 2], None, []]),
            "m": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
            "dict": pa.array(["x", "y", "x"]).dictionary_encode(),
            "b": [True, False, None],
            "bin": [b"a", None, b""],
            "dt": pa.array([dt.date(2020, 1, 1)] * 3),
        }
    )


def test_pinned_values_of_version_1() -> None:
    d = digest_batch(_table())
    assert d.to_json()["v"] == 1
    assert (d.rows, f"{d.sum:016x}") == (3, PINNED_SUM)
    assert digest_batch(pa.table({"id": pa.array([1, 2], pa.int64())})).to_json() == {
        "v": 1, "rows": 2, "sum": PINNED_ID_SUM, "cols": {"id": PINNED_ID_SUM_COL},
    }  # fmt: skip


PINNED_SUM = "5d80c5438ea1a322"
PINNED_ID_SUM = "a2f84c280e420d3b"
PINNED_ID_SUM_COL = "fd301c9cd2da70a4"


def test_other_spellings_of_the_same_values_digest_the_same() -> None:
    """What a target may hand back for what was written: wider integers and floats, another
    timestamp unit or zone, another decimal scale, large strings and lists, a decoded
    dictionary, reordered struct fields, another row and column order."""
    other = pa.table(
        {
            "dt": pa.array([dt.date(2020, 1, 1)] * 3),
            "bin": pa.array([b"", b"a", None], pa.large_binary()),
            "b": [None, True, False],
            "dict": ["x", "x", "y"],
            "m": pa.array([[], [("k", 1)], None], pa.map_(pa.string(), pa.int64())),
            "l": pa.array([[], [1, 2], None], pa.large_list(pa.int8())),
            "st": pa.array(
                [{"y": None, "x": 2}, {"y": "a", "x": 1}, None],
                pa.struct([("y", pa.large_string()), ("x", pa.int16())]),
            ),
            "d": pa.array(
                [decimal.Decimal("0.000"), decimal.Decimal("1.5"), None], pa.decimal128(20, 3)
            ),
            "ts": pa.array(
                [dt.datetime(2024, 1, 2), dt.datetime(2024, 1, 1), None],
                pa.timestamp("us", tz="UTC"),
            ),
            "f": pa.array([float("nan"), 1.5, 0.0], pa.float64()),
            "s": pa.array(["c", "a", None], pa.large_string()),
            "id": pa.array([3, 1, 2], pa.int64()),
        }
    )
    assert digest_batch(other) == digest_batch(_table())


@pytest.mark.parametrize(
    ("column", "values"),
    [
        ("id", pa.array([1, 2, 4], pa.int32())),
        ("s", pa.array(["a", "", "c"])),  # an empty string is not a null
        ("f", pa.array([1.5, 1.0, float("nan")], pa.float32())),
        (
            "ts",
            pa.array([dt.datetime(2024, 1, 1), None, dt.datetime(2024, 1, 3)], pa.timestamp("ns")),
        ),
        (
            "d",
            pa.array([decimal.Decimal("1.51"), None, decimal.Decimal("0")], pa.decimal128(10, 2)),
        ),
        ("st", pa.array([{"x": 1, "y": "b"}, None, {"x": 2, "y": None}])),
        ("l", pa.array([[2, 1], None, []])),  # a list's order counts
        ("m", pa.array([[("k", 2)], None, []], pa.map_(pa.string(), pa.int64()))),
        ("b", pa.array([True, True, None])),
        ("bin", pa.array([b"a", None, None])),
    ],
)
def test_a_changed_value_changes_the_sum_and_its_columns_sum_only(
    column: str, values: pa.Array
) -> None:
    table = _table()
    changed = table.set_column(table.schema.get_field_index(column), column, values)
    a, b = digest_batch(table), digest_batch(changed)
    assert a.sum != b.sum
    assert a.differing_columns(b) == [column]


def test_a_string_and_its_bytes_differ() -> None:
    assert digest_batch(pa.table({"v": ["a"]})) != digest_batch(pa.table({"v": [b"a"]}))


def test_a_missing_or_duplicated_row_changes_count_and_sum() -> None:
    t = _table()
    whole = digest_batch(t)
    assert digest_batch(t.slice(1)).rows == 2
    assert digest_batch(t.slice(1)).sum != whole.sum
    dup = digest_rows([t, t.slice(0, 1)])
    assert (dup.rows, dup.sum != whole.sum) == (4, True)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.text(max_size=5)), max_size=30),
    st.randoms(),
)
def test_any_split_and_order_of_rows_digests_the_same(
    rows: list[tuple[int, str]], rnd: object
) -> None:
    table = pa.table(
        {"i": [r[0] for r in rows], "s": [r[1] for r in rows]},
        schema=pa.schema([("i", pa.int64()), ("s", pa.string())]),
    )
    order = list(range(len(rows)))
    rnd.shuffle(order)  # type: ignore[attr-defined]
    shuffled = table.take(pa.array(order, pa.int64())) if rows else table
    cut = len(rows) // 3
    assert digest_rows([shuffled.slice(0, cut), shuffled.slice(cut)]) == digest_batch(table)


def test_the_json_form_round_trips_and_keeps_64_bits() -> None:
    d = digest_batch(pa.table({"x": np.arange(1000)}))
    doc = d.to_json()
    assert len(doc["sum"]) == 16
    assert Digest.from_json(doc) == d
    with pytest.raises(ValueError, match="version 2"):
        Digest.from_json({**doc, "v": 2})


def test_slices_chunks_and_buffer_layouts_digest_as_their_values() -> None:
    """The compiled loops read Arrow's buffers: an array's offset (a slice), a table's chunks,
    the offsets' width, fixed-size binaries, views, date64, time32, half floats."""
    names = [f"customer-{i}" if i % 7 else None for i in range(50)]
    whole = pa.table({"s": names, "i": list(range(50))})
    sliced = whole.slice(10, 30)
    rebuilt = pa.table({"s": names[10:40], "i": list(range(10, 40))})
    assert digest_batch(sliced) == digest_batch(rebuilt)
    chunked = pa.concat_tables([rebuilt.slice(0, 7), rebuilt.slice(7)])
    assert chunked.column(0).num_chunks == 2
    assert digest_batch(chunked) == digest_batch(rebuilt)
    assert digest_batch(pa.table({"b": pa.array([b"ab", b"cd"], pa.binary(2))})) == digest_batch(
        pa.table({"b": pa.array([b"ab", b"cd"], pa.large_binary())})
    )
    if hasattr(pa, "string_view"):
        assert digest_batch(pa.table({"s": pa.array(["x", None], pa.string_view())})) == (
            digest_batch(pa.table({"s": pa.array(["x", None])}))
        )
    day = dt.date(2024, 2, 29)
    assert digest_batch(pa.table({"d": pa.array([day], pa.date64())})) == digest_batch(
        pa.table({"d": pa.array([day], pa.date32())})
    )
    assert digest_batch(pa.table({"t": pa.array([dt.time(1, 2, 3)], pa.time32("s"))})) == (
        digest_batch(pa.table({"t": pa.array([dt.time(1, 2, 3)], pa.time64("us"))}))
    )
    half = pa.array(np.array([1.5, -0.0], dtype=np.float16))
    assert digest_batch(pa.table({"f": half})) == digest_batch(pa.table({"f": [1.5, 0.0]}))


def test_decimals_that_do_not_fit_scale_18_digest_as_their_value_too() -> None:
    """A column with one value beyond scale 18 (or 20 integer digits) is hashed value by
    value; a value that fits gives the same bits either way."""
    small = decimal.Decimal("12.5")
    fine = decimal.Decimal("0.1234567890123456789012")  # 22 fraction digits
    wide = pa.table({"d": pa.array([small, fine], pa.decimal128(38, 22))})
    narrow = pa.table({"d": pa.array([small], pa.decimal128(10, 2))})
    assert digest_batch(wide.slice(0, 1)) == digest_batch(narrow)
    other = pa.table(
        {"d": pa.array([small, decimal.Decimal("0.1234567890123456789013")], pa.decimal128(38, 22))}
    )
    assert digest_batch(wide).sum != digest_batch(other).sum
    big = pa.array([decimal.Decimal("1" + "0" * 40), small], pa.decimal256(50, 2))
    assert digest_batch(pa.table({"d": big})).rows == 2
    assert digest_batch(pa.table({"d": big.slice(1)})) == digest_batch(narrow)


@pytest.mark.parametrize("scale", [0, 2, 9, 18])
def test_small_decimals_digest_as_arrows_cast_to_scale_18_does(scale: int) -> None:
    """Precision up to 18 is brought to scale 18 in the compiled loop (128-bit products,
    negative values in two's complement); wider ones through Arrow's cast: the same bits."""
    unscaled = [0, 1, -1, 12345, -987654321, 10**17 + 3, 10**18 - 1, -(10**18 - 1)]
    values = [decimal.Decimal(k).scaleb(-scale) for k in unscaled]
    small = pa.table({"d": pa.array(values, pa.decimal128(18, scale))})
    wide = pa.table({"d": pa.array(values, pa.decimal128(38, scale))})
    assert digest_batch(small) == digest_batch(wide)
    assert digest_batch(small.slice(2)) == digest_batch(wide.slice(2))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=25), st.integers(0, 5))
def test_bytes_are_hashed_as_their_reference_says_wherever_they_lie_in_the_buffer(
    values: list[bytes | None], cut: int
) -> None:
    """The compiled loop reads whole words through shifted views, the buffer's last bytes
    one by one: a pure-Python reading of its definition gives the same hashes, for any
    lengths, any slice (values near the buffer's end included)."""
    from txsink.audit.canonical import column

    arr = pa.array(values, pa.binary()).slice(min(cut, len(values)))
    raw = column(arr).raw if len(arr) else np.zeros(0, np.uint64)
    want = [_reference_bytes_hash(v or b"") for v in arr.to_pylist()]
    got = [int(h) for h, v in zip(raw, arr.to_pylist(), strict=True)]
    assert [g for g, v in zip(got, arr.to_pylist(), strict=True) if v is not None] == [
        w for w, v in zip(want, arr.to_pylist(), strict=True) if v is not None
    ]


_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _reference_bytes_hash(data: bytes) -> int:
    """txsink.audit.kernels.hash_bytes, as its docstring defines it."""
    m = 0x9E3779B97F4A7C15
    h = ((len(data) * m) & _MASK) ^ 0x7478736B62797465
    words = [data[p : p + 8] for p in range(0, len(data), 8)]
    for word in words[:-1]:
        h = _mix64(((h * m) & _MASK) ^ int.from_bytes(word, "little"))
    if words:
        h = ((h * m) & _MASK) ^ int.from_bytes(words[-1], "little") ^ 0x7461696C7478736B
    return h
