"""Transaction-named data files: a prepared file's name says which transaction wrote it.

A task writes ``<table location>/data/<partition path>/<txn>-f<n>.parquet`` where
``<txn>`` is ``str(TxnId)`` (``txsink.<app>.<uid>.e<epoch>.r<round>.p<partition>.a<attempt>``):
deterministic (a retried attempt has its own attempt number, a replay the same name) and
parseable back, so recovery finds every file of this app and sink by listing the data
location, with no state of its own.
"""

from __future__ import annotations

import re

from txsink.txid import TxnId

__all__ = ["SUMMARY_APP", "SUMMARY_EPOCH", "SUMMARY_UID", "data_file_name", "txn_of"]

#: The snapshot summary keys of an epoch's commit: which app, sink and epoch it is.
SUMMARY_APP, SUMMARY_UID, SUMMARY_EPOCH = "txsink.app", "txsink.uid", "txsink.epoch"

_FILE = re.compile(r"^(?P<txn>txsink\.[A-Za-z0-9_.-]+)-f(?P<n>[0-9]+)\.parquet$")


def data_file_name(txn: TxnId, n: int) -> str:
    """The ``n``-th data file of ``txn`` (one per table partition value it holds)."""
    return f"{txn}-f{n}.parquet"


def txn_of(path: str) -> TxnId | None:
    """The transaction a data file's path names, or None for a file txsink did not name."""
    m = _FILE.match(path.rsplit("/", 1)[-1])
    return TxnId.try_parse(m["txn"]) if m else None
