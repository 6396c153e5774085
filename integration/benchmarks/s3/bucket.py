"""The S3 server: credentials for every writer (through the environment), the server's
process (for the CPU columns), and listing, reading back and deleting a prefix."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def list_objects(client: S3Client, bucket: str, prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", ()):
            out[obj["Key"]] = obj["Size"]
    return out


def read_parquet_objects(client: S3Client, bucket: str, keys: Sequence[str]) -> pa.Table:
    tables = [
        pq.read_table(pa.BufferReader(client.get_object(Bucket=bucket, Key=k)["Body"].read()))
        for k in keys
    ]
    return pa.concat_tables(tables) if tables else pa.table({})


def delete_prefix(client: S3Client, bucket: str, prefix: str) -> None:
    keys = list(list_objects(client, bucket, prefix))
    for i in range(0, len(keys), 1000):
        client.delete_objects(
            Bucket=bucket,
            Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
        )
    for page in client.get_paginator("list_multipart_uploads").paginate(
        Bucket=bucket, Prefix=prefix
    ):
        for upload in page.get("Uploads", ()):
            client.abort_multipart_upload(
                Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )


def server_pid(endpoint: str) -> dict[str, int]:
    """``{"s3": pid}`` of a local MinIO / moto process serving ``endpoint``'s port."""
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.port is None:
        return {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = entry.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if ("minio" in cmd or "moto" in cmd) and str(parts.port) in cmd:
            return {"s3": int(entry.name)}
    return {}


def export_credentials(args: argparse.Namespace) -> None:
    """Credentials and endpoint into the environment, before Spark starts (see the
    benchmark's doc): boto3's chain in the Python workers, s3a's provider chain in the JVM; no
    secret in a Spark setting, a pickled closure or the output."""
    os.environ["AWS_ENDPOINT_URL_S3"] = args.endpoint
    os.environ["AWS_DEFAULT_REGION"] = args.region
    os.environ["AWS_REGION"] = args.region
    if os.environ.get("TXSINK_S3_ACCESS_KEY"):
        os.environ["AWS_ACCESS_KEY_ID"] = os.environ["TXSINK_S3_ACCESS_KEY"]
        os.environ["AWS_SECRET_ACCESS_KEY"] = os.environ.get("TXSINK_S3_SECRET_KEY", "")
