"""The schema-evolution rules every target shares (txsink.schema), and the planning across a
coordinator's sinks (txsink.spark.evolve): what is a change, what is refused, in which
order, and how a change survives the log (its JSON)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from txsink.errors import ConfigurationError
from txsink.schema import (
    ADD,
    ADD_FIELD,
    WIDEN_DECIMAL,
    WIDEN_FLOAT,
    WIDEN_INT,
    SchemaChange,
    SchemaEvolutionError,
    check_policy,
    diff,
    type_names,
)
from txsink.spark.checks import check_sinks

OLD = pa.schema(
    [
        ("id", pa.int64()),
        ("amount", pa.int32()),
        ("price", pa.decimal128(10, 2)),
        ("score", pa.float32()),
        ("payload", pa.struct([("a", pa.string())])),
    ]
)


def _with(schema: pa.Schema, name: str, type_: pa.DataType) -> pa.Schema:
    return schema.set(schema.get_field_index(name), pa.field(name, type_))


def test_the_same_schema_is_no_change() -> None:
    found = diff(OLD, OLD)
    assert found.changes == () and found.refusals == () and found.merged.equals(OLD)


def test_two_spellings_of_the_same_values_are_no_change() -> None:
    target = pa.schema([("s", pa.large_string()), ("t", pa.timestamp("us", tz="UTC"))])
    incoming = pa.schema([("s", pa.string()), ("t", pa.timestamp("us", tz="Europe/Paris"))])
    assert diff(target, incoming).changes == ()


def test_a_narrower_or_missing_column_is_no_change() -> None:
    incoming = _with(OLD, "amount", pa.int16()).remove(OLD.get_field_index("score"))
    found = diff(OLD, incoming)
    assert found.changes == () and found.refusals == ()


def test_each_kind_is_found_and_merged() -> None:
    incoming = _with(OLD, "amount", pa.int64())
    incoming = _with(incoming, "price", pa.decimal128(12, 2))
    incoming = _with(incoming, "score", pa.float64())
    incoming = _with(incoming, "payload", pa.struct([("a", pa.string()), ("b", pa.int32())]))
    incoming = incoming.append(pa.field("note", pa.string(), nullable=False))
    found = diff(OLD, incoming)
    kinds = {c.column: c.kind for c in found.changes}
    assert kinds == {
        "amount": WIDEN_INT,
        "price": WIDEN_DECIMAL,
        "score": WIDEN_FLOAT,
        "payload.b": ADD_FIELD,
        "note": ADD,
    }
    assert found.merged.names == [*OLD.names, "note"]  # added columns after the target's
    assert found.merged.field("note").nullable  # old rows have no value for it
    assert found.merged.field("amount").type == pa.int64()
    assert found.merged.field("payload").type.field("b").nullable


@pytest.mark.parametrize(
    ("name", "type_"),
    [
        ("amount", pa.string()),  # int -> string
        ("price", pa.decimal128(12, 3)),  # a decimal's scale
        ("score", pa.int64()),  # float -> int
        ("id", pa.float64()),  # int -> float: not a promotion of the kinds
    ],
)
def test_a_change_without_promotion_is_refused(name: str, type_: pa.DataType) -> None:
    found = diff(OLD, _with(OLD, name, type_))
    assert [c for c, _ in found.refusals] == [name]


def test_a_change_survives_its_json() -> None:
    incoming = _with(OLD, "amount", pa.int64()).append(pa.field("note", pa.string()))
    found = diff(OLD, incoming)
    change = SchemaChange("pg", OLD, found.merged, found.changes)
    back = SchemaChange.from_json("pg", change.to_json())
    assert back == change
    assert back.describe() == "widens amount int32 -> int64; adds note (string)"


def test_the_policy_is_one_of_two() -> None:
    assert check_policy("add-columns") == "add-columns"
    with pytest.raises(ValueError, match="strict"):
        check_policy("merge")


# -- planning across sinks ---------------------------------------------------------------


class _Sink:
    """Just the hooks the planning calls (a stand-in: the planning never writes)."""

    connector = "memory"

    def __init__(self, uid: str, target: pa.Schema | None, policy: str, kinds: set[str]) -> None:
        self.uid, self.target, self.schema_evolution = uid, target, policy
        self.kinds = frozenset(kinds)
        self.prepared: list[SchemaChange] = []
        self.checked: list[pa.Schema] = []

    def target_schema(self, app_id: str) -> pa.Schema | None:
        return self.target

    def evolution_support(self) -> frozenset[str]:
        return self.kinds

    def prepare_evolution(self, change: SchemaChange, app_id: str) -> None:
        self.prepared.append(change)

    def check(self, schema: pa.Schema, app_id: str) -> None:
        self.checked.append(schema)


NEW = _with(OLD, "amount", pa.int64()).append(pa.field("note", pa.string()))
ALL = {ADD, ADD_FIELD, WIDEN_INT, WIDEN_FLOAT, WIDEN_DECIMAL}


def _plan(*sinks: Any) -> dict[str, SchemaChange]:
    return _plan_for(sinks, NEW)


def _plan_for(sinks: Any, schema: pa.Schema, **options: Any) -> dict[str, SchemaChange]:
    return check_sinks(sinks, schema, "app", None, **options)


def test_every_sink_evolves_and_checks_what_its_target_has() -> None:
    a, b, c = _Sink("a", OLD, "add-columns", ALL), _Sink("b", OLD, "add-columns", ALL), None
    c = _Sink("c", None, "strict", set())  # a target with nothing to compare yet
    changes = _plan(a, b, c)
    assert sorted(changes) == ["a", "b"]
    assert [ch.describe() for ch in a.prepared] == [
        "widens amount int32 -> int64; adds note (string)"
    ]
    # The sink's own check sees the columns its target has, at the target's types.
    assert a.checked[0].names == NEW.names[:-1]
    assert a.checked[0].field("amount").type == pa.int32()
    assert c.checked == [NEW]


def test_strict_stops_before_any_sink_prepares() -> None:
    a, b = _Sink("a", OLD, "add-columns", ALL), _Sink("b", OLD, "strict", ALL)
    with pytest.raises(SchemaEvolutionError) as info:
        _plan(a, b)
    err = info.value
    assert err.context["sink_uid"] == "b" and err.context["column"] == "amount"
    assert "schema_evolution='add-columns'" in str(err) and "adds note" in str(err)
    assert a.prepared == [] and a.checked == []


def test_a_kind_the_target_cannot_take_is_refused_by_column() -> None:
    a, b = _Sink("a", OLD, "add-columns", ALL), _Sink("b", OLD, "add-columns", {ADD})
    with pytest.raises(SchemaEvolutionError) as info:
        _plan(a, b)
    assert info.value.context["column"] == "amount"
    assert "widens amount int32 -> int64" in str(info.value) and "takes: add" in str(info.value)
    assert a.prepared == []


def test_a_change_without_promotion_is_refused_whatever_the_policy() -> None:
    a = _Sink("a", OLD, "add-columns", ALL)
    with pytest.raises(SchemaEvolutionError) as info:
        _plan_for([a], _with(OLD, "price", pa.decimal128(10, 4)))
    assert info.value.context["column"] == "price" and "cannot be promoted" in str(info.value)


def test_a_refusal_in_prepare_names_the_sink() -> None:
    a = _Sink("a", OLD, "add-columns", ALL)

    def refuse(change: SchemaChange, app_id: str) -> None:
        raise SchemaEvolutionError("not the owner of the table", column="note")

    a.prepare_evolution = refuse  # type: ignore[method-assign]
    with pytest.raises(SchemaEvolutionError) as info:
        _plan(a)
    assert info.value.context["sink_uid"] == "a" and info.value.context["phase"] == "check"


def test_the_data_source_path_refuses_any_change_saying_which_path_evolves() -> None:
    a = _Sink("a", OLD, "add-columns", ALL)
    with pytest.raises(SchemaEvolutionError) as info:
        _plan_for([a], NEW, path="format('txsink')")
    assert "format('txsink') does not evolve schemas" in str(info.value)
    assert "foreachBatch(txsink.Coordinator(...))" in str(info.value) and a.prepared == []


def test_a_column_of_a_target_type_that_takes_several_arrow_types_shows_that_type() -> None:
    text = pa.field("note", pa.null(), metadata={"txsink.target_type": "text"})
    schema = pa.schema([pa.field("id", pa.int64()), text])
    assert type_names(schema) == {"id": "int64", "note": "text"}
    assert diff(schema, pa.schema([("id", pa.int32()), ("note", pa.int64())])).changes == ()


def test_a_library_error_reading_a_target_schema_arrives_typed_naming_the_sink() -> None:
    a = _Sink("a", OLD, "add-columns", ALL)

    def broken(app_id: str) -> pa.Schema:
        raise OSError("connection reset by peer")

    a.target_schema = broken  # type: ignore[method-assign]
    with pytest.raises(ConfigurationError) as info:
        _plan(a)
    assert info.value.context["sink_uid"] == "a" and "OSError: connection reset" in str(info.value)
