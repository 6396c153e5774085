"""The start-up check of a Delta sink's rights on S3: probe each IAM action of
:data:`~txsink.connectors.delta.grants.ACTIONS` under the table's folder, and name every one
refused with the statement that grants it, before any data flows.

Why probe: S3 has no "what may I do" call, and a prefix-scoped policy refuses at the first
call it does not allow. Without this check a missing ``s3:PutObject`` surfaced as a raw
``OSError`` in the pre-commit, and a missing ``s3:DeleteObject`` only when an abort could
not delete its files. The probe goes through delta-rs's own object store (the client that
commits the log; :class:`deltalake.fs.DeltaStorageHandler`) with the sink's storage options
(its ``certificate_path``, the AWS chain when no key is given), on keys under
``<table>/_txsink/probe/`` (a random name per check), so it reads or changes no data:

================== ==============================================================
``s3:ListBucket``  list ``<table>/_txsink/probe/`` (ListObjectsV2, the ``s3:prefix``
                   condition's case)
``s3:PutObject``   write an empty probe object (a multipart upload, as data files are)
``s3:GetObject``   open the probe object (HeadObject; "not found" when the put was
                   refused is an answer, so allowed)
``s3:DeleteObject`` delete the probe object (DeleteObjects; S3 answers a missing key
                   as deleted)
================== ==============================================================

How a refusal is told from an outage: neither client types S3's ``AccessDenied`` (both
raise a bare ``OSError``, and messages are never parsed), so the probe judges by
elimination. When at least one call succeeds, the server answered and took the
credentials: each call that failed was refused, and is named with the client's own message
beside it. When every call fails, nothing tells a server that is down, untrusted or
refusing the key from a policy that grants nothing: that is raised as
:class:`~txsink.errors.UnreachableError` with the first failure, naming every statement too.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from txsink.connectors.delta import grants
from txsink.connectors.delta.errors import describe
from txsink.connectors.delta.storage import Storage
from txsink.errors import ConfigurationError, UnreachableError

__all__ = ["PROBE_FOLDER", "DeltaAccessError", "check_access", "probe"]

#: Under the table's folder; its objects live for the length of one check.
PROBE_FOLDER = "_txsink/probe/"


class DeltaAccessError(ConfigurationError):
    """The sink's credentials are refused IAM actions it needs on the table's folder;
    ``missing`` names them (S3 action names)."""

    def __init__(self, message: str, missing: list[str], **context: Any) -> None:
        super().__init__(message, **context)
        self.missing = missing


def _try(call: Callable[[], Any], absent_ok: bool = False) -> OSError | None:
    """None if ``call`` is allowed (it succeeds, or with ``absent_ok`` finds no object);
    the client's error otherwise. Only ``OSError`` is an answer: anything else is a bug."""
    try:
        call()
    except FileNotFoundError as err:
        return None if absent_ok else err
    except OSError as err:
        return err
    return None


def probe(storage: Storage) -> dict[str, OSError]:
    """The actions of :data:`~txsink.connectors.delta.grants.ACTIONS` whose probe call
    failed, with the client's error (empty: all allowed). Leaves nothing behind when the
    put and the delete are allowed."""
    import pyarrow.fs as pafs
    from deltalake.fs import DeltaStorageHandler

    store = DeltaStorageHandler(storage.uri, storage.delta_options())
    key = f"{PROBE_FOLDER}{uuid.uuid4().hex}"

    def put() -> None:
        store.open_output_stream(key, {}).close()

    calls: dict[str, tuple[Callable[[], Any], bool]] = {
        "s3:ListBucket": (
            lambda: store.get_file_info_selector(
                pafs.FileSelector(PROBE_FOLDER.rstrip("/"), allow_not_found=True)
            ),
            False,
        ),
        "s3:PutObject": (put, False),
        "s3:GetObject": (lambda: store.open_input_file(key), True),
        "s3:DeleteObject": (lambda: store.delete_file(key), True),
    }
    failed = {}
    for action in (a.name for a in grants.ACTIONS):
        call, absent_ok = calls[action]
        err = _try(call, absent_ok)
        if err is not None:
            failed[action] = err
    return failed


def _bucket_and_table(uri: str) -> tuple[str, str]:
    bucket, _, table = uri.removeprefix("s3://").partition("/")
    return bucket, table


def _grant(action: str, bucket: str, table: str) -> str:
    return json.dumps(grants.statement(action, bucket, table), separators=(",", ":"))


def check_access(storage: Storage, ctx: Mapping[str, Any]) -> None:
    """Raise :class:`DeltaAccessError` naming every action refused under the table's folder
    with the statement that grants it; :class:`~txsink.errors.UnreachableError` when every
    probe call failed (see the module's docstring). A local table is not probed."""
    if not storage.is_s3:
        return
    failed = probe(storage)
    if not failed:
        return
    bucket, table = _bucket_and_table(storage.uri)
    why = {a.name: a.why for a in grants.ACTIONS}

    def lines(said: bool) -> str:
        return "\n".join(
            f"  - {name} ({why[name]}): add the statement {_grant(name, bucket, table)}"
            + (f"\n    (the server said: {describe(err)})" if said else "")
            for name, err in failed.items()
        )

    if len(failed) == len(grants.ACTIONS):
        first = next(iter(failed.values()))
        raise UnreachableError(
            f"cannot reach the Delta table's storage at {storage.uri}: every call of the "
            f"start-up check failed, the first with {describe(first)}. Check the endpoint, "
            "the CA (storage option certificate_path) and the credentials; if those are "
            "right, the policy grants none of the sink's actions on the table's folder:\n"
            f"{lines(False)}\nNothing was written.",
            **ctx,
        )
    leftover = ""
    if "s3:DeleteObject" in failed and "s3:PutObject" not in failed:
        leftover = (
            f" The check left an empty probe object under {storage.uri}/{PROBE_FOLDER}: "
            "delete it once the rights are granted (readers of the table never see it)."
        )
    raise DeltaAccessError(
        f"the Delta sink's credentials are refused {len(failed)} action(s) it needs on "
        f"{storage.uri}, found by the start-up check before any data was written:\n"
        f"{lines(True)}\nGrant them to the sink's IAM user or role (the whole least-privilege "
        f"policy is in docs/security.md, section Delta).{leftover}",
        list(failed),
        **ctx,
    )
