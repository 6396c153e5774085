"""The old paths of the modules that moved into the core's rooms (issue #36), kept working.

``import txsink.inspect`` (or ``from txsink.log import TxLog``) still works and gives the
very module object of its new home (``txsink.ops.inspect``), so an object has one class
and one identity whichever path imported it: ``isinstance``, ``monkeypatch.setattr`` and
pickling by reference all agree. One meta-path finder, installed by ``txsink/__init__``
before anything else, answers for the paths in :data:`MOVED` only; every other import is
left to Python's own finders.

Why a finder and not a shim module per old path: a shim (``from txsink.ops.inspect import
*``) is a second module object (a patched name in one is not patched in the other) and
would put the old paths back as files in the folder the rooms emptied. Old paths are for
running code written against them; type checkers see only the new paths (docs and our own
code use those).

rooms-rewrite: skip (this table names the old paths on purpose)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "install"]

#: old module path -> its new home. The same table as the rewrite that moved them
#: (``rooms_rewrite.py``, issue #36).
MOVED: dict[str, str] = {
    # kit
    "txsink._target": "txsink.kit",
    "txsink._target.formats": "txsink.kit.formats",
    "txsink._target.manifests": "txsink.kit.manifests",
    "txsink._json": "txsink.kit.jsonrows",
    "txsink._process": "txsink.kit.process",
    "txsink._procs": "txsink.kit.procs",
    "txsink._format": "txsink.kit.text",
    "txsink._fs": "txsink.store",
    # observe
    "txsink._logging": "txsink.observe.logs",
    "txsink._failure": "txsink.observe.failure",
    "txsink._outages": "txsink.observe.outages",
    "txsink._metering": "txsink.observe.metering",
    "txsink.prometheus": "txsink.observe.prometheus",
    "txsink.otel": "txsink.observe.otel",
    # protocol
    "txsink._decide": "txsink.protocol.decide",
    "txsink._commit": "txsink.protocol.commit",
    "txsink._actions": "txsink.protocol.plan",
    "txsink._rounds": "txsink.protocol.rounds",
    "txsink.recovery": "txsink.protocol.recovery",
    "txsink.log": "txsink.protocol.log",
    "txsink._blocks": "txsink.protocol.blocks",
    "txsink.lease": "txsink.protocol.lease",
    "txsink.faults": "txsink.protocol.faults",
    "txsink._task": "txsink.protocol.task",
    "txsink._taskerror": "txsink.protocol.taskerror",
    "txsink._votes": "txsink.protocol.votes",
    "txsink._singlepass": "txsink.protocol.singlepass",
    "txsink._epochresult": "txsink.protocol.epoch",
    # spark
    "txsink._spark": "txsink.spark.jobs",
    "txsink._sparkepoch": "txsink.spark.epoch",
    "txsink._layout": "txsink.spark.layout",
    "txsink._stability": "txsink.spark.stability",
    "txsink.localspark": "txsink.spark.localspark",
    "txsink._jvmcds": "txsink.spark.jvmcds",
    "txsink._cdsbuild": "txsink.spark.cdsbuild",
    "txsink._jvmlog": "txsink.spark.jvmlog",
    "txsink._remote": "txsink.spark.remote",
    "txsink.sparkview": "txsink.spark.sparkview",
    # ops
    "txsink.state": "txsink.ops.state",
    "txsink.savepoint": "txsink.ops.savepoint",
    "txsink._savepoint_records": "txsink.ops.savepoint_records",
    "txsink._savepoint_manifest": "txsink.ops.savepoint_manifest",
    "txsink._checkpoint": "txsink.ops.checkpoint",
    "txsink.inspect": "txsink.ops.inspect",
    "txsink.report": "txsink.ops.report",
    "txsink._report_charts": "txsink.ops.report_charts",
    "txsink._html": "txsink.ops.html",
    "txsink.operate": "txsink.ops.operate",
    "txsink._operator": "txsink.ops.operator",
    "txsink._precheck": "txsink.ops.precheck",
    "txsink._follow": "txsink.ops.follow",
    # the Data Source face's own modules
    "txsink._dsepoch": "txsink.datasource.epoch",
    "txsink._dsoptions": "txsink.datasource.options",
    # the command line
    "txsink._pipeline": "txsink.cli.pipeline",
    # testing (issue #41 made room for txsink.schema in the base)
    "txsink.verify": "txsink.testing.verifiers",
}


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module of its new one (imported first, under its own name)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        # Python sets the module's __spec__ to the alias's after this: kept to put it back.
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the module stays itself: its name, its spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
