"""The txsink log on S3: AWS S3 or an S3-compatible server (MinIO).

Use it by giving the log an ``s3://bucket/prefix`` location::

    from txsink import Coordinator, open_log
    from txsink.connectors.s3.log_store import S3Store

    # Credentials, region and endpoint from boto3's usual chain: environment
    # (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,
    # AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL for MinIO), profile, instance role.
    Coordinator(sinks, log="s3://my-bucket/pipelines/orders/txlog")

    # Explicit settings: ``client_options`` go to ``boto3.client("s3", ...)`` as given.
    store = S3Store(
        "s3://my-bucket/pipelines/orders/txlog",
        client_options={
            "endpoint_url": "http://127.0.0.1:9000",
            "aws_access_key_id": "...",
            "aws_secret_access_key": "...",
            "region_name": "us-east-1",
        },
    )
    Coordinator(sinks, log=store)
    open_log("s3://my-bucket/pipelines/orders/txlog", client_options={...})  # the same store

How each :class:`~txsink.store.LogStore` operation maps to S3 (a record ``key`` is
stored as the object ``<prefix><key>``; the operations are the S3 connector's one
implementation, :class:`~txsink.connectors.s3.store.S3Objects`):

* ``create`` — ``PutObject`` with ``If-None-Match: *``. S3 answers 412
  ``PreconditionFailed`` when the key exists: ``create`` returns False. Because
  botocore may resend a PUT whose first attempt did succeed (its answer was lost),
  every create carries a random token in its object metadata and a 412 is
  checked against it: the call returns True exactly when *its* bytes are the
  record. AWS answers 409 ``ConditionalRequestConflict`` when a conflicting
  write races on the key; the create is then retried (a few times, with
  backoff) and settles on 200 or 412.
* ``read`` — ``GetObject``; ``NoSuchKey`` reads as ``None``.
* ``list`` — ``ListObjectsV2`` pages (``page_size`` keys per request), sorted.
* ``delete`` — ``DeleteObject`` (deleting a missing key is not an error).

Conditional writes are checked, not assumed: a store that ignores
``If-None-Match`` silently overwrites, and then two drivers could both decide
one epoch — the fencing of zombie drivers and the create-if-absent commit point
would be gone without any error. Before its first write, a store probes its
location once per process (PUT a probe key, PUT it again conditionally: the
second must be refused; the probe key is deleted) and raises
:class:`ConditionalWritesUnsupportedError` otherwise. Reading the log (for
example ``txsink status``) needs no probe and no write permission.

Secrets: ``client_options`` are handed to boto3 and not kept; ``repr`` shows
them with ``aws_secret_access_key`` / ``aws_session_token`` as ``***``. No
message, log line or record names a secret, and a store refuses to be pickled
(it belongs to the driver; a pickle would carry the client's credentials).

Errors: every botocore failure becomes a :class:`~txsink.errors.LogError` that
names the operation, the key and the location, mapped by S3 error code or HTTP
status (no such bucket, access denied, throttled, endpoint unreachable, no
credentials).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from txsink.connectors.s3.client import make_client, parse_s3_url, safe_options
from txsink.connectors.s3.errors import describe, log_error, redact_url
from txsink.connectors.s3.store import S3Objects
from txsink.errors import ConditionalWritesUnsupportedError, ConfigurationError, LogError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["ConditionalWritesUnsupportedError", "S3Store"]

_logger = logging.getLogger(__name__)

#: Probe objects live directly under the log prefix, outside ``epochs/`` and ``meta.json``,
#: so a reader of the log never sees one (and prefix-scoped permissions still cover them).
_PROBE_PREFIX = "_txsink-probe-"

# Locations whose conditional writes were probed successfully in this process.
_probed: set[tuple[str, str, str]] = set()
_probe_lock = threading.Lock()


class S3Store(S3Objects):
    """A :class:`~txsink.store.LogStore` on S3; see the module docstring for the contract.

    Args:
        url: ``s3://bucket/prefix`` (``s3a://`` is accepted too); the log's
            records are the objects under ``prefix/``.
        client_options: keyword arguments for ``boto3.client("s3", ...)``
            (``endpoint_url``, ``aws_access_key_id``, ``aws_secret_access_key``,
            ``aws_session_token``, ``region_name``, ``config``...). Without them
            boto3's chain decides. Not kept after the client is built.
        client: an S3 client to use instead (then ``client_options`` must be empty),
            e.g. one from your own ``boto3.Session``.
        page_size: keys per ``ListObjectsV2`` request (1..1000).
        conflict_retries: how often a create answered 409
            ``ConditionalRequestConflict`` is retried before giving up.
    """

    def __init__(
        self,
        url: str,
        *,
        client_options: Mapping[str, Any] | None = None,
        client: S3Client | None = None,
        page_size: int = 1000,
        conflict_retries: int = 5,
    ) -> None:
        try:
            loc = parse_s3_url(url)
        except ValueError as err:
            raise ConfigurationError(f"txsink log location: {err}") from err
        shown = safe_options(client_options)
        if client is not None:
            if client_options:
                raise ValueError("S3Store: pass client_options or client, not both")
        else:
            try:
                client = make_client(client_options)
            except Exception as err:  # botocore's own errors for bad options (no secrets)
                raise ConfigurationError(
                    f"cannot build an S3 client for the txsink log at {loc.url} with "
                    f"client_options={shown}: {type(err).__name__}: {err}"
                ) from err
        super().__init__(
            client,
            loc.bucket,
            loc.prefix,
            fail=self._log_failure,
            page_size=page_size,
            conflict_retries=conflict_retries,
        )
        self._shown_options = shown
        self.endpoint = redact_url(self._client.meta.endpoint_url)

    def __repr__(self) -> str:
        options = f", client_options={self._shown_options!r}" if self._shown_options else ""
        return f"S3Store({self.location!r}, endpoint={self.endpoint!r}{options})"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"{self!r} cannot be pickled: the txsink log is used by the driver only, and a "
            "pickle would carry the S3 client's credentials"
        )

    def create(self, key: str, data: bytes) -> bool:
        """Create ``key`` unless it exists; True if this call created it (see module doc)."""
        self.check_conditional_writes()
        return super().create(key, data)

    # -- the conditional-write probe -------------------------------------------------------

    def check_conditional_writes(self) -> None:
        """Make sure the store refuses a second create of a key; once per process and location.

        Raises:
            ConditionalWritesUnsupportedError: the store overwrote the key, or does not
                implement ``If-None-Match``.
            LogError: the probe itself failed (no bucket, access denied, unreachable).
        """
        ident = (self.endpoint, self.bucket, self.prefix)
        with _probe_lock:
            if ident in _probed:
                return
            # Under the lock: threads of one process probe a location once, not N times.
            self._probe()
            _probed.add(ident)

    def _probe(self) -> None:
        name = f"{self.prefix}{_PROBE_PREFIX}{uuid.uuid4().hex}"
        written = False
        try:
            written = self._create(name, b"txsink conditional-write probe 1\n", "probe")
            if not written:  # a fresh random key cannot exist
                self._unsupported(f"the first conditional PUT of a new key ({name}) was refused")
            if self._create(name, b"txsink conditional-write probe 2\n", "probe"):
                self._unsupported(
                    f"a second PUT with If-None-Match: * of {name} succeeded and overwrote it"
                )
        finally:
            if written:
                try:
                    self.delete(name[len(self.prefix) :])
                except LogError as err:
                    _logger.warning("could not delete the probe object %s: %s", name, err)

    def _no_conditional_writes(self, name: str, op: str, err: Exception) -> NoReturn:
        self._unsupported(f"the server answered {describe(err)} to PutObject")

    def _unsupported(self, what: str) -> NoReturn:
        raise ConditionalWritesUnsupportedError(
            f"the S3 store at {self.endpoint} does not honour conditional writes "
            f"(If-None-Match: *), so it cannot hold the txsink log at {self.location}: {what}. "
            "The log's create-if-absent is the commit point of every epoch and what fences a "
            "zombie driver; on this store two drivers could both decide an epoch. Put the log "
            "on AWS S3, on a MinIO release from late 2024 or newer, or on another location "
            "(a local or mounted filesystem path); see docs/log-on-s3.md"
        )

    def _log_failure(self, op: str, where: str, err: Exception) -> Exception:
        return log_error(op, where, self.bucket, self.endpoint, err)
