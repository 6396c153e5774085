"""Avro keys and values for the Kafka connector, with a Confluent-compatible Schema Registry.

Records are encoded by confluent-kafka's own ``AvroSerializer`` (Confluent
wire format: magic byte, schema id, Avro binary), so any consumer with
``AvroDeserializer`` or a Confluent-compatible reader decodes them. The Avro
schema is the user's (``value_schema=``) or derived from the Arrow schema of
the columns (:func:`avro_schema`). The schema is registered (or, with
``auto.register.schemas=False``, looked up) on the driver at start, so an
unreachable registry or an incompatible schema fails before anything is
written; tasks then encode in pre-commit, and the encoded bytes are what the
WAL keeps and the replay checksum covers.

A derived value schema keeps the subject's latest version where the columns still fit it
(:func:`~txsink.connectors.kafka.records.fromavro.planned`): its fields in its order and
types, then the new columns. The tasks derive it from the epoch's own columns and the
latest version the driver read at the check, so an epoch that adds a column registers
the new version in its tasks, before the decision, and a replay of an epoch derives the
same schema (and the same schema id) again (:mod:`~txsink.connectors.kafka.evolve`).

The registry config (``url``, ``basic.auth.user.info``, TLS files ...) goes to
``SchemaRegistryClient`` untouched and is never logged; errors name the URL only, without
any ``user:password@`` in it. A registry that refuses the credentials (HTTP 401) or the
user's rights (HTTP 403) is told apart from a refused schema, at the start-up check and in
a task alike, and the error names the setting to fix (:func:`access_refused`).
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pyarrow as pa

from txsink.connectors.kafka.records.fromavro import planned, record_fields, same_shape
from txsink.errors import ConfigurationError, RetryableError, WriteError

__all__ = ["AvroEncoder", "avro_schema"]

R = TypeVar("R")
_SECRET_KEYS = ("basic.auth.user.info", "bearer.auth.token", "bearer.auth.client.secret")
_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")


def safe_url(url: str) -> str:
    """``url`` without the ``user:password@`` a URL credentials source may carry."""
    return _USERINFO.sub("", url)


def _caused_by(err: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``kind`` is ``err`` or in its chain of causes (the registry client wraps the
    ``ssl`` module's errors in its HTTP library's own)."""
    seen: BaseException | None = err
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def access_refused(url: str, status: int, what: str) -> str | None:
    """The message for a registry that refused the client's credentials (401) or the
    user's rights (403) while it tried ``what``; None for any other status.

    Why apart from a refused schema: the fix is in the client's config or the registry's
    users, never in the schema."""
    if status == 401:
        return (
            f"Schema Registry at {url} refused the credentials (HTTP 401) when {what}. Set "
            "schema_registry={..., 'basic.auth.user.info': '<user>:<password>'} with a "
            "registry user's password (read it from a file or an environment variable, "
            "never write it in code), and check it is the user's current password"
        )
    if status == 403:
        return (
            f"Schema Registry at {url} authenticated the user but refused the request (HTTP "
            f"403) when {what}: the sink registers (or, with auto.register.schemas=False, looks "
            "up) its schemas, and both need the right to write schemas under the subject "
            "(AxonOps: the role 'developer'; Confluent RBAC: DeveloperWrite on the subject). "
            "Grant it to the registry user, see docs/security.md, section Schema Registry"
        )
    return None


def avro_schema(arrow_type: pa.DataType, name: str, *, nullable: bool = True) -> Any:
    """The Avro schema (as JSON-able data) Spark's Arrow ``arrow_type`` maps to.

    Records get ``name`` (nested ones ``name_<field>``), nullable types become
    ``["null", T]`` with a null default so later schema versions can add fields.
    Raises ``ValueError`` naming the type for what Avro cannot hold.
    """
    t = _non_null(arrow_type, name)
    return ["null", t] if nullable else t


def _non_null(t: pa.DataType, name: str) -> Any:
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return "int"
    if pa.types.is_uint8(t) or pa.types.is_uint16(t):
        return "int"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "long"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    if pa.types.is_date32(t):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_timestamp(t):
        unit = "millis" if t.unit in ("s", "ms") else "micros"
        local = "" if t.tz else "local-"
        return {"type": "long", "logicalType": f"{local}timestamp-{unit}"}
    if pa.types.is_decimal(t):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": t.precision,
            "scale": t.scale,
        }
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"type": "array", "items": avro_schema(t.value_type, f"{name}_item")}
    if pa.types.is_map(t):
        if not pa.types.is_string(t.key_type):
            raise ValueError(f"map keys must be strings for Avro, not {t.key_type}")
        return {"type": "map", "values": avro_schema(t.item_type, f"{name}_value")}
    if pa.types.is_struct(t):
        return {
            "type": "record",
            "name": name,
            "fields": [
                {"name": f.name, "type": avro_schema(f.type, f"{name}_{f.name}"), "default": None}
                for f in t
            ],
        }
    raise ValueError(f"Arrow type {t} has no Avro equivalent")


def record_name(topic: str | None, field: str) -> str:
    """A valid Avro record name for a topic's key or value (``orders-v1`` → ``orders_v1_value``)."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", topic or "txsink")
    if not re.match(r"[A-Za-z_]", base):
        base = "_" + base
    return f"{base}_{field}"


def _full_name(schema: str | None) -> str | None:
    """A named schema's full name (what record-name subject strategies use)."""
    doc = json.loads(schema or "null")
    if not isinstance(doc, dict) or "name" not in doc:
        return None
    name = str(doc["name"])
    namespace = doc.get("namespace")
    return f"{namespace}.{name}" if namespace and "." not in name else name


def _maps_to_dicts(value: Any, t: pa.DataType) -> Any:
    """Arrow's ``to_pylist`` gives maps as lists of pairs; Avro wants dicts."""
    if value is None:
        return None
    if pa.types.is_map(t):
        return {k: _maps_to_dicts(v, t.item_type) for k, v in value}
    if pa.types.is_struct(t):
        return {f.name: _maps_to_dicts(value.get(f.name), f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_maps_to_dicts(v, t.value_type) for v in value]
    return value


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_map(t.value_type)
    return False


def registry_unavailable(err: BaseException) -> bool:
    """Whether ``err`` (raised by the serializer) says the registry could not be reached or
    failed on its side (a transport error, HTTP 5xx): transient, unlike a bad row.

    The registry client's HTTP library is a vendored httpx whose module name varies between
    confluent-kafka releases, so its transport errors are recognised by class name.
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(err, SchemaRegistryError):
        return err.http_status_code >= 500
    return isinstance(err, (OSError, TimeoutError)) or any(
        cls.__name__ == "TransportError" for cls in type(err).__mro__
    )


class AvroEncoder:
    """Encodes one record field (key or value) of the Kafka connector with ``AvroSerializer``.

    Holds configuration only until first use; the registry client and the
    serializer are built lazily in each process (they are not picklable) and
    dropped when the encoder is pickled into a Spark task.
    """

    def __init__(
        self,
        field: str,
        registry_config: Mapping[str, Any],
        schema: str | None,
        serializer_config: Mapping[str, Any] | None,
        *,
        topic: str | None = None,
    ) -> None:
        if field not in ("key", "value"):
            raise ValueError(f"field must be 'key' or 'value', not {field!r}")
        if "url" not in registry_config:
            raise ValueError("schema_registry needs at least {'url': 'http://host:8081'}")
        self.field = field
        self.registry_config = dict(registry_config)
        #: The user's schema (``key_schema``/``value_schema``); without one, the schema is
        #: derived from the columns' Arrow type (:meth:`schema_for`), in the tasks too.
        self.schema = schema
        self.given = schema is not None
        self.serializer_config = dict(serializer_config or {})
        #: The Avro record's name for a derived schema: the sink's topic's (the driver's
        #: compatibility test and the tasks derive one name, before any check ran too).
        self.name = record_name(topic, field)
        #: The Arrow type the check derived the schema for, and the schema: the tasks write
        #: batches of the same values with it (a time zone may differ, say).
        self.fixed: tuple[pa.DataType, str] | None = None
        #: The subject's latest version as Arrow fields, read on the driver at the check;
        #: a derived schema keeps it where the columns fit (None: the columns as they are).
        self.latest: pa.Schema | None = None
        self._serializers: dict[str, Any] = {}
        self._derived: dict[pa.DataType, str] = {}
        self._client: Any = None

    @property
    def url(self) -> str:
        """The registry's URL for messages: any ``user:password@`` removed."""
        return safe_url(str(self.registry_config["url"]))

    def safe_config(self) -> dict[str, Any]:
        return {k: ("***" if k in _SECRET_KEYS else v) for k, v in self.registry_config.items()}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_serializers"] = {}
        state["_derived"] = {}
        state["_client"] = None
        return state

    def resolve_schema(
        self, arrow_type: pa.DataType, topic: str | None, latest: pa.Schema | None = None
    ) -> str:
        """The Avro schema for columns of ``arrow_type`` (the user's, or derived after the
        subject's ``latest`` version); driver, at the check. What it fixes here travels into
        the tasks. Raises ``ValueError`` naming a type Avro cannot hold."""
        if self.given:
            return str(self.schema)
        self.name = record_name(topic, self.field)
        self.latest, self.fixed = latest, None
        self._derived.clear()
        text = self.schema_for(arrow_type)
        self.fixed = (arrow_type, text)
        return text

    def schema_for(self, arrow_type: pa.DataType) -> str:
        """The schema records of ``arrow_type`` are written with: the user's, or derived
        from the subject's latest version and the columns (:func:`planned`). A pure
        function of the two, so every task of an epoch, and its replay, derive one text."""
        if self.given:
            return str(self.schema)
        if self.fixed is not None and same_shape(self.fixed[0], arrow_type):
            return self.fixed[1]
        text = self._derived.get(arrow_type)
        if text is None:
            shape = planned(self.latest, arrow_type)
            text = json.dumps(avro_schema(shape, self.name, nullable=False))
            self._derived[arrow_type] = text
        return text

    def subject(self, topic: str, schema: str) -> str:
        """The subject ``schema`` goes under for ``topic`` (the serializer's strategy)."""
        from confluent_kafka.schema_registry import topic_subject_name_strategy
        from confluent_kafka.serialization import MessageField, SerializationContext

        strategy = self.serializer_config.get("subject.name.strategy")
        strategy = strategy or topic_subject_name_strategy
        field = MessageField.VALUE if self.field == "value" else MessageField.KEY
        return str(strategy(SerializationContext(topic, field), _full_name(schema)))

    def client(self) -> Any:
        """This process's ``SchemaRegistryClient`` (made on first use)."""
        if self._client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            self._client = SchemaRegistryClient(dict(self.registry_config))
        return self._client

    def register(self, topic: str, ctx: dict[str, Any], text: str | None = None) -> int:
        """Register (or look up) ``text`` (default: the user's schema) under the topic's
        subject; the schema id."""
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        text = text if text is not None else str(self.schema)
        subject, schema = self.subject(topic, text), Schema(text, "AVRO")
        register = self.serializer_config.get("auto.register.schemas", True)
        try:
            return self.ask(
                topic,
                ctx,
                f"registering the {self.field} schema of {topic!r}",
                lambda client: (
                    int(client.register_schema(subject, schema))
                    if register
                    else int(client.lookup_schema(subject, schema).schema_id)
                ),
            )
        except SchemaRegistryError as err:
            raise ConfigurationError(
                f"Schema Registry at {self.url} refused the {self.field} schema for topic "
                f"{topic!r} (HTTP {err.http_status_code}, error {err.error_code}): "
                f"{err.error_message}. If the subject holds an incompatible schema, evolve it "
                "compatibly (add fields with defaults) or change the subject's compatibility",
                **ctx,
            ) from err

    def ask(self, topic: str, ctx: dict[str, Any], doing: str, call: Callable[[Any], R]) -> R:
        """``call(client)``, on the driver. A registry that refuses the credentials or the
        rights (:func:`access_refused`), or cannot be reached, is a
        :class:`~txsink.errors.ConfigurationError` naming what to fix; any other answer of
        the registry (``SchemaRegistryError``) is the caller's to tell."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return call(self.client())
        except SchemaRegistryError as err:
            refused = access_refused(self.url, err.http_status_code, doing)
            if refused is not None:
                raise ConfigurationError(refused + "; nothing was written", **ctx) from err
            raise
        except Exception as err:  # unreachable (the HTTP client's own types), bad schema
            hint = ""
            if _caused_by(err, ssl.SSLCertVerificationError):
                hint = (
                    " The client does not trust the registry's certificate: pass its CA as "
                    "schema_registry={..., 'ssl.ca.location': '/path/ca.crt'}."
                )
            raise ConfigurationError(
                f"cannot use Schema Registry at {self.url} for the {self.field} of topic "
                f"{topic!r}: {type(err).__name__}: {err}.{hint} Check the registry's url (and "
                "that it runs and is reachable) and the schema",
                **ctx,
            ) from err

    def latest_fields(self, topic: str, ctx: dict[str, Any]) -> tuple[str, pa.Schema] | None:
        """The subject's latest version (its text) and its record's fields as Arrow, for a
        derived schema; None when the subject has no version, or its latest is not a record
        txsink could have derived (then nothing is compared, as before evolution existed)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        subject = self.subject(topic, json.dumps({"name": record_name(topic, self.field)}))

        def latest(client: Any) -> str:
            client.clear_latest_caches()  # the client keeps a latest version for a while
            return str(client.get_latest_version(subject).schema.schema_str)

        try:
            text = self.ask(topic, ctx, f"reading the latest {self.field} schema of {subject!r}",
                            latest)  # fmt: skip
        except SchemaRegistryError as err:
            if err.http_status_code == 404:  # no such subject (40401), or no version (40402)
                return None
            raise ConfigurationError(
                f"Schema Registry at {self.url} did not give the latest version of subject "
                f"{subject!r} (HTTP {err.http_status_code}, error {err.error_code}): "
                f"{err.error_message}. Check the registry and the sink's user's rights",
                **ctx,
            ) from err
        fields = record_fields(text)
        return None if fields is None else (text, fields)

    def encode(
        self,
        column: pa.Array,
        topics: list[str],
        first_row: int,
        ctx: dict[str, Any],
        column_name: str,
    ) -> pa.Array:
        """Encode every row of ``column`` (a struct column for records) for its topic."""
        from confluent_kafka.serialization import MessageField, SerializationContext

        try:
            serializer = self._get(self.schema_for(column.type))
        except ValueError as err:  # a type Avro cannot hold (the check tells it first)
            raise WriteError(
                f"cannot derive an Avro {self.field} schema: {err}. Cast the column or pass "
                f"{self.field}_schema=",
                row=first_row,
                column=column_name,
                **ctx,
            ) from err
        mf = MessageField.VALUE if self.field == "value" else MessageField.KEY
        rows = column.to_pylist()
        if _has_map(column.type):
            rows = [_maps_to_dicts(r, column.type) for r in rows]
        contexts: dict[str, Any] = {}
        out: list[bytes | None] = []
        for i, (row, topic) in enumerate(zip(rows, topics, strict=True)):
            sc = contexts.get(topic)
            if sc is None:
                sc = contexts[topic] = SerializationContext(topic, mf)
            try:
                out.append(serializer(row, sc))
            except Exception as err:  # fastavro raises ValueError/TypeError, the registry its own
                status = getattr(err, "http_status_code", None)
                refused = (
                    access_refused(
                        self.url, status, f"encoding the {self.field} for topic {topic!r}"
                    )
                    if isinstance(status, int)
                    else None
                )
                if refused is not None:  # a password changed or a right revoked since the start
                    raise ConfigurationError(
                        refused, row=first_row + i, column=column_name, **ctx
                    ) from err
                if registry_unavailable(err):
                    raise RetryableError(
                        f"Schema Registry at {self.url} did not answer while encoding the "
                        f"{self.field} for topic {topic!r}: {type(err).__name__}: "
                        f"{str(err)[:300]}. Spark retries the task; if it keeps failing, check "
                        "that the registry runs and is reachable from the executors",
                        row=first_row + i,
                        column=column_name,
                        **ctx,
                    ) from err
                raise WriteError(
                    f"cannot encode the {self.field} as Avro: {type(err).__name__}: "
                    f"{str(err)[:300]}. Fix the row or the schema (value_schema=/key_schema=)",
                    row=first_row + i,
                    column=column_name,
                    **ctx,
                ) from err
        return pa.array(out, pa.binary())

    def _get(self, text: str) -> Any:
        """The serializer of schema ``text`` (one per schema: an epoch that evolved the
        schema writes with the new one, the serializer registers it on first use)."""
        serializer = self._serializers.get(text)
        if serializer is None:
            from confluent_kafka.schema_registry.avro import AvroSerializer

            serializer = AvroSerializer(
                self.client(), text, conf=dict(self.serializer_config) or None
            )
            self._serializers[text] = serializer
        return serializer
