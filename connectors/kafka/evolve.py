"""Schema evolution for Kafka values in Avro (issue #41): the sink's hooks, on the driver.

Only a value the sink derives from the payload columns of one topic follows the subject's
versions (:meth:`~txsink.connectors.kafka.records.format.RecordFormat.evolving_value`);
other values (JSON, bytes, a given ``value_schema``, a ``value=`` column, ``topic_column``)
compare nothing, as before evolution existed.

- The target's schema is the subject's latest version, read back as Arrow
  (:func:`target_schema`); the columns that are not in the value (key, headers, partition)
  are there as type ``null``, which the core compares with nothing.
- Kinds taken: ``add`` and ``add-field`` (a field ``["null", T]`` with ``"default":
  null``, which old records read as null), ``widen-int`` and ``widen-float`` (Avro's own
  promotions int to long, float to double). A decimal's precision is no Avro promotion.
- Before the decision (:func:`prepare`): the new schema, derived as the tasks will derive
  it, is tested with the registry's compatibility endpoint under the subject's level;
  refused, the epoch stops before anything is written, naming the column, the subject, the
  level and the fix. Nothing is registered here.
- The tasks register the new version as they encode the epoch's records (before they vote,
  so before the decision). An epoch aborted afterwards leaves that version registered: a
  registry cannot take a version back without an admin's delete, which would break readers
  that cached its id. It is harmless: no record references it, and the epoch's next
  attempt derives the identical schema and gets the same id.
- Nothing of the schema is applied at commit: the records were encoded with the new
  schema before the decision, and a replay derives it again from the latest version
  (:func:`~txsink.connectors.kafka.records.fromavro.planned`), so it encodes the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, Final, TypeVar

import pyarrow as pa

from txsink.connectors.kafka.records.avro import AvroEncoder, avro_schema
from txsink.connectors.kafka.records.format import RecordFormat
from txsink.connectors.kafka.records.fromavro import planned
from txsink.errors import ConfigurationError
from txsink.schema import (
    ADD,
    ADD_FIELD,
    WIDEN_FLOAT,
    WIDEN_INT,
    ColumnChange,
    SchemaChange,
    SchemaEvolutionError,
)

__all__ = ["SUPPORTED", "prepare", "target_schema"]

R = TypeVar("R")

#: The kinds an Avro subject takes in one epoch (:mod:`txsink.schema`).
SUPPORTED: Final = frozenset({ADD, ADD_FIELD, WIDEN_INT, WIDEN_FLOAT})


def target_schema(records: RecordFormat, ctx: dict[str, Any]) -> pa.Schema | None:
    """The subject's latest version as the DataFrame's columns: the record's fields, then
    the key, headers and partition columns as type ``null`` (not in the value; the sink's
    check judges them, as before). None when the value does not follow the subject, the
    subject has no version yet, or its latest is not a record txsink derives."""
    encoder = records.evolving_value()
    if encoder is None or records.topic is None:
        return None
    found = encoder.latest_fields(records.topic, ctx)
    if found is None:
        return None
    fields = found[1]
    others = [c for c in records.special_columns() if c not in fields.names]
    return pa.schema([*fields, *(pa.field(c, pa.null()) for c in others)])


def prepare(change: SchemaChange, records: RecordFormat, uid: str, ctx: dict[str, Any]) -> None:
    """Will the subject take the epoch's new value schema? Tested with the registry's
    compatibility endpoint under the subject's level; writes nothing. Raises
    :class:`~txsink.schema.SchemaEvolutionError` naming the refused column, the subject,
    its level and the fix."""
    encoder, topic = records.evolving_value(), records.topic
    if encoder is None or topic is None:  # target_schema gave None: nothing to evolve
        return
    conf = encoder.serializer_config
    if conf.get("use.latest.version"):
        raise _error(
            uid,
            change.columns[0],
            f"sink {uid!r} cannot evolve the value schema of topic {topic!r}: avro_config "
            "has use.latest.version=True, so the serializer writes with the subject's latest "
            "version whatever the columns. Register the new version yourself before the "
            "epoch that brings the change, or drop use.latest.version so the sink derives "
            "the schema from the columns. Nothing of the epoch was written",
        )
    found = encoder.latest_fields(topic, ctx)
    latest = found[1] if found is not None else None
    text = _derived(encoder, latest, _value_type(change.new, records))
    at = _Subject(encoder, topic, encoder.subject(topic, text), ctx)
    if not conf.get("auto.register.schemas", True):
        at.check_registered(text, change, uid)
        return
    level = at.level()
    if at.compatible(text, level):
        return
    refused = [
        c
        for c in change.columns
        if not at.compatible(_one_change(encoder, latest, change, c, records), level)
    ] or list(change.columns)
    raise _error(uid, refused[0], _refusal(uid, at.subject, level, refused, encoder.url))


def _value_type(schema: pa.Schema, records: RecordFormat) -> pa.DataType:
    """The value record's columns of ``schema`` (the payload columns, as the tasks take
    them)."""
    return pa.struct([schema.field(n) for n in records.payload_columns(schema.names)])


def _derived(encoder: AvroEncoder, latest: pa.Schema | None, columns: pa.DataType) -> str:
    """The schema the tasks derive for records of ``columns``
    (:meth:`~txsink.connectors.kafka.records.avro.AvroEncoder.schema_for`), as text."""
    return json.dumps(avro_schema(planned(latest, columns), encoder.name, nullable=False))


def _one_change(
    encoder: AvroEncoder,
    latest: pa.Schema | None,
    change: SchemaChange,
    column: ColumnChange,
    records: RecordFormat,
) -> str:
    """The schema with ``column``'s change alone: to tell which change a subject refuses
    (the Python client does not return the registry's reasons)."""
    fields = _with(list(change.old), column.path, column)
    return _derived(encoder, latest, _value_type(pa.schema(fields), records))


def _with(fields: list[pa.Field], path: tuple[str, ...], change: ColumnChange) -> list[pa.Field]:
    name, rest = path[0], path[1:]
    if not rest and change.old is None:
        return [*fields, pa.field(name, change.new, True)]
    if not rest:
        return [f.with_type(change.new) if f.name == name else f for f in fields]
    return [
        f.with_type(pa.struct(_with(list(f.type), rest, change))) if f.name == name else f
        for f in fields
    ]


@dataclasses.dataclass(frozen=True)
class _Subject:
    """The questions asked of the registry about one subject, on the driver."""

    encoder: AvroEncoder
    topic: str
    subject: str
    ctx: dict[str, Any]

    def level(self) -> str:
        """The subject's compatibility level, or the registry's when it sets none."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        def level(client: Any) -> str:
            try:
                return str(client.get_compatibility(self.subject))
            except SchemaRegistryError as err:
                if err.http_status_code != 404:  # 40408: no level of its own
                    raise
                return str(client.get_compatibility())

        try:
            return self._ask(f"reading the compatibility of {self.subject!r}", level)
        except SchemaRegistryError as err:
            raise self._failed("read the compatibility level of", err) from err

    def compatible(self, text: str, level: str) -> bool:
        """The registry's compatibility test of ``text`` against what ``level`` checks: the
        latest version, or every version for a ``*_TRANSITIVE`` level."""
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        schema = Schema(text, "AVRO")
        normalize = bool(self.encoder.serializer_config.get("normalize.schemas", False))

        def test(client: Any) -> bool:
            if level.upper().endswith("_TRANSITIVE"):
                return bool(client.test_compatibility_all_versions(self.subject, schema, normalize))
            return bool(client.test_compatibility(self.subject, schema, "latest", normalize))

        try:
            return self._ask(f"testing a new version of {self.subject!r}", test)
        except SchemaRegistryError as err:
            if err.http_status_code == 404:  # the subject was deleted meanwhile: a first version
                return True
            raise self._failed("test a new version of", err) from err

    def check_registered(self, text: str, change: SchemaChange, uid: str) -> None:
        """With ``auto.register.schemas=False`` the tasks look the schema up: it must be there."""
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        schema = Schema(text, "AVRO")
        try:
            self._ask(
                f"looking up the new version of {self.subject!r}",
                lambda client: client.lookup_schema(self.subject, schema),
            )
        except SchemaRegistryError as err:
            if err.http_status_code != 404:
                raise self._failed("look up a version of", err) from err
            raise _error(
                uid,
                change.columns[0],
                f"sink {uid!r}: the epoch {change.describe()}, and avro_config has "
                f"auto.register.schemas=False, but subject {self.subject!r} has no version of "
                f"the new value schema. Register it yourself (POST /subjects/{self.subject}/"
                f"versions with this schema: {text}), or let the sink register it "
                "(auto.register.schemas=True); nothing of the epoch was written",
            ) from err

    def _ask(self, doing: str, call: Callable[[Any], R]) -> R:
        return self.encoder.ask(self.topic, self.ctx, doing, call)

    def _failed(self, doing: str, err: Any) -> ConfigurationError:
        return ConfigurationError(
            f"Schema Registry at {self.encoder.url} could not {doing} subject "
            f"{self.subject!r} (HTTP {err.http_status_code}, error {err.error_code}): "
            f"{err.error_message}. Nothing of the epoch was written",
            **self.ctx,
        )


def _refusal(uid: str, subject: str, level: str, refused: list[ColumnChange], url: str) -> str:
    changes = "; ".join(c.describe() for c in refused)
    widened = [c for c in refused if c.old is not None]
    if widened:
        c = widened[0]
        fix = (
            f"Under {level} a reader with the subject's older schema must read records of the "
            f"new one, and Avro readers cannot narrow {c.new} to {c.old}. Cast {c.column!r} "
            f"back to {c.old} before the sink; or, once every consumer reads with the new "
            f"schema, set the subject's compatibility to BACKWARD (PUT /config/{subject} "
            '{"compatibility": "BACKWARD"})'
        )
    else:
        fix = (
            f'The new field is optional (a ["null", T] union with default null), which '
            f"{level} takes against versions txsink derived: an older version of the subject "
            f"may hold a field {refused[0].column!r} of another type (a *_TRANSITIVE level "
            "checks every version). Rename the column before the sink, or change the "
            "subject's compatibility"
        )
    return (
        f"the Schema Registry at {url} refuses the evolved value schema of sink {uid!r} "
        f"under subject {subject!r} (compatibility {level}): the epoch {changes}. Nothing of "
        f"the epoch was written, no version registered. {fix}"
    )


def _error(uid: str, column: ColumnChange, message: str) -> SchemaEvolutionError:
    return SchemaEvolutionError(
        message, sink_uid=uid, column=column.column, connector="kafka", phase="check"
    )
