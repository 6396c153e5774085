"""The connector registry: how the core, the CLI and the testing toolkit find connectors.

A connector registers one :class:`Connector` record under the entry-point group
``txsink.connectors`` of its distribution (txsink's own connectors do so in txsink's
``pyproject.toml``)::

    [project.entry-points."txsink.connectors"]
    mytable = "mytable_txsink.plugin:CONNECTOR"

The record names, as ``"module:attribute"`` references loaded only when used, what
the rest of txsink may need from the connector:

* ``testing``: its :class:`~txsink.testing.adapter.ConnectorTesting` adapter (the
  chaos runner's pipeline factory, verifiers, observer targets, the contract suite);
* ``log_stores``: URL schemes under which it can hold the txsink log
  (``open_log("s3://...")``);
* ``commands``: extra ``txsink`` subcommands (:class:`txsink.cli.Command` objects);
* ``sink``: its sink class, built from string options by the Data Source path
  (``df.writeStream.format("txsink").option("connector", name)``, :mod:`txsink.datasource`).

This is the only way the core reaches a connector: nothing in ``txsink/`` imports
``txsink.connectors`` or branches on a connector's name. The module holding the
record must import nothing heavy (no client library): listing connectors, parsing
the CLI or finding a log store must work with only some extras installed.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from txsink.errors import ConfigurationError

__all__ = ["GROUP", "Connector", "connector", "connectors", "load", "log_store_schemes"]

#: The entry-point group connectors register under.
GROUP = "txsink.connectors"


@dataclass(frozen=True)
class Connector:
    """What a connector registers (see the module doc). References are ``"module:attr"``."""

    name: str
    summary: str
    #: The pip extra that installs its client library (``pip install 'txsink[<extra>]'``).
    extra: str | None = None
    #: Its testing adapter: a :class:`~txsink.testing.adapter.ConnectorTesting` instance.
    testing: str | None = None
    #: URL scheme -> a factory ``(url, **options) -> LogStore`` for the txsink log.
    log_stores: Mapping[str, str] = field(default_factory=dict)
    #: Subcommand name -> a :class:`txsink.cli.Command`.
    commands: Mapping[str, str] = field(default_factory=dict)
    #: Its sink class (a :class:`~txsink.sink.TwoPhaseCommitSink`), for the Data Source path.
    sink: str | None = None

    def load_testing(self) -> Any:
        """The testing adapter (imports the connector and its client library)."""
        if self.testing is None:
            raise ConfigurationError(
                f"connector {self.name!r} registers no testing adapter: the chaos toolkit and "
                "the contract suite cannot drive it"
            )
        return load(self.testing, self)


def load(ref: str, owner: Connector | None = None) -> Any:
    """The object a ``"module:attr"`` reference names; a missing extra says how to install it."""
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        hint = ""
        if owner is not None and owner.extra:
            hint = f": install it with pip install 'txsink[{owner.extra}]'"
        what = f"connector {owner.name!r}" if owner is not None else ref
        raise ConfigurationError(f"{what} cannot be loaded ({err}){hint}") from err
    return getattr(module, attr) if attr else module


@functools.cache
def connectors() -> dict[str, Connector]:
    """Every registered connector, by name (sorted)."""
    found: dict[str, Connector] = {}
    for ep in entry_points(group=GROUP):
        record = ep.load()
        if not isinstance(record, Connector):
            raise ConfigurationError(
                f"entry point {ep.name!r} of group {GROUP!r} ({ep.value}) is a "
                f"{type(record).__name__}, not a txsink.registry.Connector"
            )
        if record.name != ep.name:
            raise ConfigurationError(
                f"entry point {ep.name!r} of group {GROUP!r} registers connector "
                f"{record.name!r}: the two names must be the same"
            )
        if record.name in found and found[record.name] != record:
            raise ConfigurationError(f"two distributions register connector {record.name!r}")
        found[record.name] = record
    return dict(sorted(found.items()))


def connector(name: str) -> Connector:
    """The registered connector ``name``, or an error listing those that are."""
    known = connectors()
    if name not in known:
        raise ConfigurationError(
            f"no txsink connector {name!r} is registered (registered: {', '.join(known)}). "
            f"Connectors register under the entry-point group {GROUP!r}; is its "
            "distribution installed in this environment?"
        )
    return known[name]


def log_store_schemes() -> dict[str, tuple[Connector, str]]:
    """URL scheme -> (the connector that registers it, its store factory reference)."""
    schemes: dict[str, tuple[Connector, str]] = {}
    for record in connectors().values():
        for scheme, ref in record.log_stores.items():
            schemes.setdefault(scheme, (record, ref))
    return schemes
