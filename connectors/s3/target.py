"""Where one S3 sink writes and how it talks to the bucket: clients, typed errors, stores.

An :class:`S3Target` is plain data (bucket, prefix, sink uid, client options), so it
pickles into Spark tasks with the sink; clients are built per process from the options and
cached (:func:`~txsink.connectors.s3.client.cached_client`), never pickled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txsink.connectors.s3.client import cached_client, completing_options, safe_options
from txsink.connectors.s3.errors import redact_url, sink_error
from txsink.connectors.s3.store import S3Objects
from txsink.errors import ConfigurationError, TxsinkError
from txsink.observe.logs import EpochLogger, get_logger
from txsink.txid import TxnId

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3Target"]

_VERBS = {"create": "write", "put": "write", "read": "read", "list": "list", "delete": "delete"}


@dataclass(frozen=True)
class S3Target:
    """An S3 sink's output ``s3://<bucket>/<prefix>`` for sink ``uid``."""

    bucket: str
    prefix: str  # empty or ends with "/"
    uid: str
    client_options: Mapping[str, Any] | None = None

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def client(self) -> S3Client:
        """This process's client for the options (bad options: a ConfigurationError)."""
        try:
            return cached_client(self.client_options)
        except Exception as err:  # bad options: botocore's messages name no secret values
            raise ConfigurationError(
                f"cannot build an S3 client for {self.url} with client_options="
                f"{safe_options(self.client_options)}: {type(err).__name__}: {err}",
                **self.ctx(),
            ) from err

    @property
    def completing_client(self) -> S3Client:
        """The client for ``CompleteMultipartUpload``: a read timeout of at least 10 minutes
        (see :func:`~txsink.connectors.s3.client.completing_options`)."""
        try:
            return cached_client(completing_options(self.client_options))
        except Exception:
            return self.client

    def ctx(self, **extra: Any) -> dict[str, Any]:
        return {"sink_uid": self.uid, "connector": "s3", **extra}

    def log(self, epoch: int | None = None) -> EpochLogger:
        return get_logger("txsink.connectors.s3.sink", uid=self.uid, epoch=epoch)

    def error(
        self,
        err: Exception,
        doing: str,
        key: str,
        *,
        phase: str,
        txn: TxnId | None = None,
        epoch: int | None = None,
    ) -> TxsinkError:
        """A typed, secret-free error for a failed S3 call on ``key`` of the bucket."""
        ctx = self._phase_ctx(phase, txn, epoch)
        return self._error(err, doing, f"s3://{self.bucket}/{key}", ctx)

    def _phase_ctx(self, phase: str, txn: TxnId | None, epoch: int | None) -> dict[str, Any]:
        ctx = self.ctx(phase=phase)
        if txn is not None:
            ctx.update(epoch=txn.epoch, partition=txn.partition)
        elif epoch is not None:
            ctx["epoch"] = epoch
        return ctx

    def _error(self, err: Exception, doing: str, where: str, ctx: Mapping[str, Any]) -> TxsinkError:
        try:
            endpoint = redact_url(self.client.meta.endpoint_url)
        except Exception:
            endpoint = "<unknown endpoint>"
        return sink_error(err, doing, f"{where} at {endpoint}", bucket=self.bucket, context=ctx)

    def objects(
        self, what: str, *, phase: str, txn: TxnId | None = None, epoch: int | None = None
    ) -> S3Objects:
        """The objects under the prefix as a store; failures read ``cannot <op> <what> ...``."""
        ctx = self._phase_ctx(phase, txn, epoch)

        def fail(op: str, where: str, err: Exception) -> Exception:
            return self._error(err, f"{_VERBS.get(op, op)} {what}", where, ctx)

        return S3Objects(self.client, self.bucket, self.prefix, fail=fail)
