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

One broken registration breaks only itself: an entry point whose record cannot be
loaded (its module is gone, e.g. an editable install of a deleted checkout; it is not a
:class:`Connector`; two distributions register its name) is kept aside as an
:class:`Unloadable`. :func:`connectors` lists the others, which work as before; asking
for the broken one by name (:func:`connector`, ``format("txsink")``'s ``connector``
option, a log URL of a scheme it would have registered) raises its error, naming the
entry point, its distribution and the import error.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from txsink.errors import ConfigurationError

__all__ = [
    "GROUP",
    "Connector",
    "Unloadable",
    "connector",
    "connectors",
    "load",
    "log_store_schemes",
    "unloadable",
]

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


@dataclass(frozen=True)
class Unloadable:
    """A registered entry point whose :class:`Connector` record could not be loaded."""

    name: str
    #: The entry point as written: ``"module:attribute"``.
    value: str
    #: The distribution that declares it, as ``"name version"`` (None if unknown).
    distribution: str | None
    #: Why it could not be loaded: the exception type and message.
    reason: str

    def error(self) -> ConfigurationError:
        """The error for a use of this connector: what is broken and the two fixes."""
        dist = self.distribution or "an unknown distribution"
        fix = (
            f"reinstall {self.distribution.split()[0]} in this environment (an editable "
            "install whose folder was moved or deleted fails so) or uninstall it"
            if self.distribution
            else "reinstall or uninstall the distribution that declares it"
        )
        return ConfigurationError(
            f"connector {self.name!r} is registered but cannot be loaded: entry point "
            f"'{self.name} = {self.value}' (group {GROUP!r}) of {dist}: {self.reason}. "
            f"Fix: {fix}; the other connectors are not affected",
            connector=self.name,
        )


def _distribution(ep: EntryPoint) -> str | None:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else None


@functools.cache
def _scan() -> tuple[dict[str, Connector], dict[str, Unloadable]]:
    """Load every entry point of :data:`GROUP` once per process: the records, and the
    entry points that failed (each failure stays with its own name)."""
    found: dict[str, Connector] = {}
    broken: dict[str, Unloadable] = {}
    for ep in entry_points(group=GROUP):
        unloadable = functools.partial(Unloadable, ep.name, ep.value, _distribution(ep))
        try:
            record = ep.load()
        except Exception as err:  # any import-time failure of a third-party module
            broken[ep.name] = unloadable(f"{type(err).__name__}: {err}")
            continue
        if not isinstance(record, Connector):
            reason = f"it is a {type(record).__name__}, not a txsink.registry.Connector"
        elif record.name != ep.name:
            reason = f"it registers connector {record.name!r}: the two names must be the same"
        elif (ep.name in found and found[ep.name] != record) or ep.name in broken:
            reason = "two distributions register this name"
        else:
            found[record.name] = record
            continue
        found.pop(ep.name, None)
        broken[ep.name] = unloadable(reason)
    return dict(sorted(found.items())), dict(sorted(broken.items()))


def connectors() -> dict[str, Connector]:
    """Every registered connector that loads, by name (sorted); see :func:`unloadable`."""
    return dict(_scan()[0])


def unloadable() -> dict[str, Unloadable]:
    """The registered entry points whose record could not be loaded, by name."""
    return dict(_scan()[1])


def connector(name: str) -> Connector:
    """The registered connector ``name``, or an error: why it cannot be loaded, or those
    that are registered."""
    known, broken = _scan()
    if name in broken:
        raise broken[name].error()
    if name not in known:
        unusable = f"; registered but broken: {', '.join(broken)}" if broken else ""
        raise ConfigurationError(
            f"no txsink connector {name!r} is registered (registered: {', '.join(known)}"
            f"{unusable}). Connectors register under the entry-point group {GROUP!r}; is its "
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
