"""``s3_secure``: MinIO as production runs an object store: TLS only, and a least-privilege
user for the sink whose policy allows only the target prefix and the log prefix.

The same MinIO binary as :mod:`.s3` (built once), a data folder of its own
(``.work/s3_secure``), emptied at every start (the root credentials are new each time and
MinIO encrypts its IAM data with them). Every start makes:

* a throw-away CA and a server certificate signed by it, with ``IP:127.0.0.1`` in its
  subjectAltName (``openssl``, as :mod:`.postgres_secure` does), as ``public.crt`` /
  ``private.key`` in MinIO's ``--certs-dir``: MinIO then serves HTTPS only on its port;
* new random credentials for the root user (the harness's, for set-up and read-back
  only) and for the user ``txsink-app``, both in an AWS shared-credentials file (mode
  0600) as the profiles ``txsink-root`` and ``txsink-app``: the env names the file and the
  profile, never a secret;
* the bucket ``txsink-secure`` and the canned policy ``txsink-app`` attached to the user:
  :func:`txsink.connectors.s3.grants.policy` for the target prefix ``app/`` and the log
  prefix ``txsink-log/``, nothing else. Users and policies are made with MinIO's admin API
  through MinIO's own Python SDK (``minio``, a dev dependency: the request bodies are
  encrypted with the root secret, which the SDK implements).

The env it writes: ``TXSINK_S3_SECURE_ENDPOINT`` (``https://127.0.0.1:<port>``),
``TXSINK_S3_SECURE_CA`` (the CA file: boto3's ``verify=`` or ``AWS_CA_BUNDLE``),
``TXSINK_S3_SECURE_CREDENTIALS`` (``AWS_SHARED_CREDENTIALS_FILE``),
``TXSINK_S3_SECURE_PROFILE`` and ``TXSINK_S3_SECURE_ADMIN_PROFILE`` (``AWS_PROFILE``),
``TXSINK_S3_SECURE_ACCESS_KEY`` (the app user's key id: not a secret),
``TXSINK_S3_SECURE_BUCKET``, ``TXSINK_S3_SECURE_PREFIX``, ``TXSINK_S3_SECURE_LOG_PREFIX``
and ``TXSINK_S3_SECURE_POLICY`` (the policy's name, for tests that change it).
"""

from __future__ import annotations

import configparser
import contextlib
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, ClassVar

from .base import LocalService
from .common import LOG_DIR, LOOPBACK, WORK_DIR, ServiceError, StartReport, port_open
from .s3 import REGION, build_minio, minio_command, minio_env
from .tls import make_server_certificate

DEFAULT_PORT = 59100
DEFAULT_CONSOLE_PORT = 59101
APP_USER = "txsink-app"
APP_PROFILE = "txsink-app"
ROOT_USER = "txsink-root"
ROOT_PROFILE = "txsink-root"
POLICY = "txsink-app"
BUCKET = "txsink-secure"
PREFIX = "app/"
LOG_PREFIX = "txsink-log/"

SECURE_DIR = WORK_DIR / "s3_secure"
DATA_DIR = SECURE_DIR / "data"
CERTS_DIR = SECURE_DIR / "certs"
CA_FILE = SECURE_DIR / "ca.crt"
CREDENTIALS = SECURE_DIR / "credentials"
LOG_FILE = LOG_DIR / "s3_secure.log"
TLS_LOG = LOG_DIR / "s3_secure-tls.log"


def read_profile(profile: str, path: Path = CREDENTIALS) -> tuple[str, str] | None:
    """(key id, secret) of ``profile`` in the shared-credentials file, or None."""
    parser = configparser.ConfigParser()
    if not path.exists() or not parser.read(path) or not parser.has_section(profile):
        return None
    sec = parser[profile]
    return sec.get("aws_access_key_id", ""), sec.get("aws_secret_access_key", "")


def write_credentials(profiles: dict[str, tuple[str, str]], path: Path = CREDENTIALS) -> None:
    """The AWS shared-credentials file, mode 0600 before any secret goes in."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    tmp.touch(mode=0o600)
    with tmp.open("w") as fh:
        for name, (key, secret) in profiles.items():
            fh.write(
                f"[{name}]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
                f"region = {REGION}\n\n"
            )
    tmp.replace(path)


def make_certificates() -> None:
    """A new CA (``ca.crt``) and a server certificate for 127.0.0.1 in ``certs/``."""
    shutil.rmtree(CERTS_DIR, ignore_errors=True)
    CERTS_DIR.mkdir(parents=True)
    make_server_certificate(
        ca_file=CA_FILE,
        crt=CERTS_DIR / "public.crt",
        key=CERTS_DIR / "private.key",
        label="s3_secure",
        log_path=TLS_LOG,
    )


def _client(port: int, profile: str) -> Any:
    """A boto3 S3 client of ``profile`` over verified TLS (None without boto3 or profile)."""
    creds = read_profile(profile)
    if creds is None:
        return None
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=f"https://{LOOPBACK}:{port}",
        aws_access_key_id=creds[0],
        aws_secret_access_key=creds[1],
        region_name=REGION,
        verify=str(CA_FILE),
        config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}),
    )


def admin_client(port: int) -> Any:
    """MinIO's admin API client (``minio.MinioAdmin``) as root over verified TLS."""
    try:
        import urllib3
        from minio import MinioAdmin
        from minio.credentials.providers import StaticProvider
    except ImportError as exc:
        raise ServiceError(
            "s3_secure makes its user with MinIO's admin API through the `minio` package: "
            "install the dev extras (pip install -e '.[all,dev]')"
        ) from exc
    root = read_profile(ROOT_PROFILE)
    if root is None:
        raise ServiceError(f"s3_secure: no {ROOT_PROFILE} profile in {CREDENTIALS}")
    return MinioAdmin(
        endpoint=f"{LOOPBACK}:{port}",
        credentials=StaticProvider(*root),
        region=REGION,
        secure=True,
        http_client=urllib3.PoolManager(ca_certs=str(CA_FILE), cert_reqs="CERT_REQUIRED"),
    )


def app_policy(without: tuple[str, ...] = ()) -> dict[str, Any]:
    """The least-privilege policy of the app user (less ``without``)."""
    from txsink.connectors.s3.grants import policy

    return policy(BUCKET, PREFIX, LOG_PREFIX, without=without)


class S3Secure(LocalService):
    """TLS-only MinIO with a least-privilege user (module docstring)."""

    name = "s3_secure"
    default_ports: ClassVar[dict[str, int]] = {
        "port": DEFAULT_PORT,
        "console_port": DEFAULT_CONSOLE_PORT,
    }
    start_timeout = 120.0
    logs = ((LOG_FILE, 25),)

    def marker(self, state: dict[str, Any]) -> str:
        return str(DATA_DIR)

    def healthy(self, state: dict[str, Any]) -> bool:
        port = state.get("port")
        if not isinstance(port, int) or not port_open(port):
            return False
        try:
            root = _client(port, ROOT_PROFILE)
            if root is None:
                return False
            root.list_buckets()
            if state.get("provisioned"):
                app = _client(port, APP_PROFILE)
                if app is None:
                    return False
                app.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX, MaxKeys=1)
            return True
        except Exception:
            return False

    def env(self, state: dict[str, Any]) -> dict[str, str]:
        app = read_profile(APP_PROFILE)
        return {
            "TXSINK_S3_SECURE_ENDPOINT": f"https://{LOOPBACK}:{state['port']}",
            "TXSINK_S3_SECURE_CA": str(CA_FILE),
            "TXSINK_S3_SECURE_CREDENTIALS": str(CREDENTIALS),
            "TXSINK_S3_SECURE_PROFILE": APP_PROFILE,
            "TXSINK_S3_SECURE_ADMIN_PROFILE": ROOT_PROFILE,
            "TXSINK_S3_SECURE_ACCESS_KEY": app[0] if app else "",
            "TXSINK_S3_SECURE_BUCKET": BUCKET,
            "TXSINK_S3_SECURE_PREFIX": PREFIX,
            "TXSINK_S3_SECURE_LOG_PREFIX": LOG_PREFIX,
            "TXSINK_S3_SECURE_POLICY": POLICY,
            "TXSINK_S3_SECURE_REGION": REGION,
        }

    def start(self, state: dict[str, Any], taken_ports: set[int], report: StartReport) -> None:
        t0 = time.monotonic()
        binary = build_minio(report)
        state["provisioned"] = False
        self.assign_ports(state, taken_ports, report)
        shutil.rmtree(DATA_DIR, ignore_errors=True)
        DATA_DIR.mkdir(parents=True)
        make_certificates()
        root_secret = secrets.token_hex(24)
        write_credentials({ROOT_PROFILE: (ROOT_USER, root_secret)})
        self.launch(
            minio_command(binary, state, DATA_DIR, CERTS_DIR),
            state,
            LOG_FILE,
            env=minio_env(ROOT_USER, root_secret),
            cwd=SECURE_DIR,
            what="minio (s3_secure)",
        )
        report.notes.append(f"TLS, user {APP_USER}, {time.monotonic() - t0:.1f}s")

    def warm_up(self, state: dict[str, Any]) -> None:
        """As root: the bucket, the policy and the app user with a new secret."""
        port = int(state["port"])
        root = _client(port, ROOT_PROFILE)
        if root is None:
            raise ServiceError("s3_secure needs boto3 in the venv for set-up")
        with contextlib.suppress(root.exceptions.BucketAlreadyOwnedByYou):
            root.create_bucket(Bucket=BUCKET)
        admin = admin_client(port)
        app_secret = secrets.token_hex(24)
        admin.policy_add(POLICY, policy=app_policy())
        admin.user_add(APP_USER, app_secret)
        admin.policy_set(POLICY, user=APP_USER)
        root_creds = read_profile(ROOT_PROFILE)
        assert root_creds is not None
        write_credentials({ROOT_PROFILE: root_creds, APP_PROFILE: (APP_USER, app_secret)})
        state["provisioned"] = True
