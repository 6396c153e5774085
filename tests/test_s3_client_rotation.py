"""The process's cached S3 client follows a rotated secret in boto3's credential chain.

A driver restarted in the same process (``txsink recover`` after the credentials file was
updated, a notebook, a reused Spark Python worker) must sign with the current secret, not
the one the first client resolved (integration/test_secret_rotation.py shows it on MinIO).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from txsink.connectors.s3.client import cached_client

OPTIONS = {"region_name": "us-east-1", "endpoint_url": "https://127.0.0.1:9"}


def _write(path: Path, secret: str) -> None:
    path.write_text(f"[rot]\naws_access_key_id = AKIDROT\naws_secret_access_key = {secret}\n")


def test_a_rewritten_credentials_file_gives_a_new_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    creds = tmp_path / "credentials"
    _write(creds, "old-secret")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_PROFILE", "rot")
    first = cached_client(OPTIONS)
    assert cached_client(OPTIONS) is first  # unchanged chain: shared
    assert _secret(first) == "old-secret"
    new = tmp_path / "credentials.new"
    _write(new, "new-secret")
    os.replace(new, creds)  # as a rotation script does
    second = cached_client(OPTIONS)
    assert second is not first
    assert _secret(second) == "new-secret"
    assert cached_client(OPTIONS) is second


def _secret(client: Any) -> str:
    """The secret the client signs with (botocore's resolved credentials)."""
    return str(client._request_signer._credentials.secret_key)
