"""The options of ``format("txsink")``: one connector's sink, its log and its app, from strings.

Spark hands a Data Source its options as strings with case-insensitive names. The sink's
options are its constructor's keyword parameters (``dsn``, ``table``, ``uid``...), found in
the constructor's signature through the registry (the core knows no connector), converted
by their annotation: ``int``, ``float``, ``bool`` (``true``/``false``), lists (JSON or
comma-separated) and maps (JSON). Everything is checked before a row is written; every
refusal is a :class:`~txsink.errors.ConfigurationError` naming the option and the fix.

Secrets: an option's value is never logged nor put in an error unless it is a number or a
boolean; :func:`redacted` is how options are shown.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from txsink import registry
from txsink.contract import SinkContract
from txsink.errors import ConfigurationError

__all__ = ["DsConfig", "parse_options", "redacted"]

#: Options of the Data Source itself (not of the sink), lower-case as Spark gives them.
OWN = {
    "connector": "the registered connector to write with (txsink connectors lists them)",
    "log": "where the txsink log lives (a path or URL), as Coordinator(log=...)",
    "app_id": "the app's stable id (default: the streaming query's id)",
    "retain_epochs": "how many epochs of records the log keeps (default 100)",
    "lease_s": "seconds the driver lease lives unrenewed (default 60; docs/operations.md)",
    "epoch": "static writes: the epoch to write (a re-run with it writes nothing twice)",
}
#: Options Spark itself sets or reads; accepted and ignored.
SPARK = {"checkpointlocation", "path", "queryname"}


@dataclass(frozen=True)
class DsConfig:
    """A parsed ``format("txsink")`` configuration (picklable: a sink and strings)."""

    connector: str
    sink: SinkContract[Any, Any]
    log: str
    app_id: str | None
    retain_epochs: int
    epoch: int | None
    checkpoint: str | None
    lease_s: float | None = None


def redacted(options: Mapping[str, str]) -> str:
    """Options as text fit for a log: names only, values hidden."""
    return "{" + ", ".join(f"{k}=***" for k in sorted(options)) + "}"


def parse_options(options: Mapping[str, str]) -> DsConfig:
    """Build the sink and read the Data Source's own options; raise on anything wrong."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    name = _required(opts, "connector")
    record = registry.connector(name)
    if record.sink is None:
        raise ConfigurationError(
            f"connector {name!r} registers no sink class (its registry record's sink=): it "
            "cannot be used through format('txsink'); use foreachBatch(Coordinator(...))",
            connector=name,
            phase="check",
        )
    cls = registry.load(record.sink, record)
    params = _sink_params(cls)
    unknown = sorted(set(opts) - set(params) - set(OWN) - SPARK)
    if "max_tasks" in unknown:
        raise ConfigurationError(
            "max_tasks is an option of foreachBatch(Coordinator(...)): through "
            "format('txsink') Spark plans the write's tasks itself. Coalesce the stream "
            "before writeStream instead (stream.coalesce(n).writeStream...)",
            connector=name,
            phase="check",
        )
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {unknown} for format('txsink') with connector {name!r}: the "
            f"options are the sink's parameters {sorted(params)} and {sorted(OWN)}. Fix the "
            "option's name",
            connector=name,
            phase="check",
        )
    kwargs: dict[str, Any] = {}
    for key, param in params.items():
        if key in opts:
            kwargs[param.name] = _convert(name, param, opts[key])
        elif param.default is inspect.Parameter.empty:
            raise ConfigurationError(
                f"format('txsink') with connector {name!r} needs the option {param.name!r}: "
                f'add .option("{param.name}", ...)',
                connector=name,
                phase="check",
            )
    try:
        sink = cls(**kwargs)
    except (ValueError, TypeError) as err:
        raise ConfigurationError(
            f"the options of connector {name!r} were refused: {err}. Fix the option it names",
            connector=name,
            phase="check",
        ) from None
    if sink.commits_in_task or sink.commits_from_data or sink.required_partitioning():
        raise ConfigurationError(
            f"sink {sink.uid} needs its rows partitioned by key, or commits in its tasks or "
            "from the epoch's rows (modes that need the query's own Spark jobs), which a "
            "Data Source cannot ask Spark for: choose the connector's default mode (append, "
            "WAL), or use foreachBatch(Coordinator(...))",
            sink_uid=sink.uid,
            connector=name,
            phase="check",
        )
    return DsConfig(
        connector=name,
        sink=sink,
        log=_required(opts, "log"),
        app_id=opts.get("app_id") or None,
        retain_epochs=_int(name, "retain_epochs", opts.get("retain_epochs", "100"), minimum=1),
        epoch=_int(name, "epoch", opts["epoch"], minimum=0) if "epoch" in opts else None,
        checkpoint=opts.get("checkpointlocation"),
        lease_s=_lease_s(name, opts["lease_s"]) if "lease_s" in opts else None,
    )


def _lease_s(connector: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigurationError(
            f'option "lease_s" must be a number of seconds > 0, got {text!r}',
            connector=connector,
            phase="check",
        )
    return value


def _required(opts: Mapping[str, str], key: str) -> str:
    value = opts.get(key, "").strip()
    if not value:
        raise ConfigurationError(
            f'format("txsink") needs the option {key!r} ({OWN[key]}): add .option("{key}", ...)',
            phase="check",
        )
    return value


def _sink_params(cls: type) -> dict[str, inspect.Parameter]:
    """The sink constructor's named parameters (by lower-case name), without ``log``: the
    Data Source's own log option serves the whole query."""
    sig = inspect.signature(cls)
    return {
        p.name.lower(): p
        for p in sig.parameters.values()
        if p.name not in ("self", "log")
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def _convert(connector: str, param: inspect.Parameter, text: str) -> Any:
    """A string option as the parameter's annotated type (``from __future__`` annotations
    are strings: read as such, never evaluated)."""
    note = str(param.annotation)
    words = set(
        note.replace("[", " ").replace("]", " ").replace("|", " ").replace(",", " ").split()
    )
    if "None" in words and text.strip().lower() in ("", "none", "null"):
        return None
    if words & {"bool"}:
        low = text.strip().lower()
        if low not in ("true", "false"):
            raise ConfigurationError(
                f"option {param.name!r} takes true or false, got {text!r}",
                connector=connector,
                phase="check",
            )
        return low == "true"
    if words & {"int"}:
        return _int(connector, param.name, text)
    if words & {"float"}:
        try:
            return float(text)
        except ValueError:
            raise ConfigurationError(
                f"option {param.name!r} takes a number, got {text!r}",
                connector=connector,
                phase="check",
            ) from None
    if words & {"Mapping", "dict"}:
        value = _json(connector, param.name, text)
        if not isinstance(value, dict):
            raise ConfigurationError(
                f'option {param.name!r} takes a JSON object ({{"name": value}})',
                connector=connector,
                phase="check",
            )
        return value
    if words & {"Sequence", "list", "tuple"}:
        if text.lstrip().startswith("["):
            return list(_json(connector, param.name, text))
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def _json(connector: str, name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        # The value may hold a secret (a password in a client config): never echoed.
        raise ConfigurationError(
            f"option {name!r} is not valid JSON: pass it as json.dumps(...) of the value",
            connector=connector,
            phase="check",
        ) from None


def _int(connector: str, name: str, text: str, minimum: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ConfigurationError(
            f"option {name!r} takes an integer{bound}, got {text!r}",
            connector=connector,
            phase="check",
        )
    return value
