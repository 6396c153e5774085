"""Throw-away certificates for the secured services: a new CA and one server certificate
for 127.0.0.1, made with ``openssl`` at every start (nothing in them is worth keeping).

Shared by :mod:`.postgres_secure`, :mod:`.s3_secure` and :mod:`.registry_secure`: each passes
its own paths. The CA's signing key is deleted once the server certificate is signed, so none
lingers.
"""

from __future__ import annotations

from pathlib import Path

from .common import LOOPBACK, run

#: Days the throw-away certificates are valid: they are re-made at every start.
CERT_DAYS = 7


def make_server_certificate(
    *, ca_file: Path, crt: Path, key: Path, label: str, log_path: Path
) -> None:
    """A new CA (``ca_file``, named after ``label``) and a server certificate (``crt``,
    private key ``key`` mode 0600) with ``IP:127.0.0.1, DNS:localhost`` in its
    subjectAltName, so clients can verify both the chain and the host name."""
    work = ca_file.parent
    ca_key, csr, ext = work / "ca.key", work / "server.csr", work / "server.ext"
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    days = ["-days", str(CERT_DAYS)]
    run(
        ["openssl", "req", "-x509", *curve, "-keyout", str(ca_key), "-out", str(ca_file), *days,
         "-subj", f"/CN=txsink test CA ({label})",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        timeout=60, log_path=log_path,
    )  # fmt: skip
    run(
        ["openssl", "req", *curve, "-keyout", str(key), "-out", str(csr), "-subj",
         f"/CN={LOOPBACK}"],
        timeout=60, log_path=log_path,
    )  # fmt: skip
    ext.write_text(
        f"subjectAltName = IP:{LOOPBACK}, DNS:localhost\n"
        "basicConstraints = CA:FALSE\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\n"
        "extendedKeyUsage = serverAuth\n"
    )
    run(
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_file), "-CAkey", str(ca_key),
         "-CAcreateserial", "-out", str(crt), *days, "-extfile", str(ext)],
        timeout=60, log_path=log_path,
    )  # fmt: skip
    for path in (ca_key, csr, ext, work / "ca.srl"):
        path.unlink(missing_ok=True)
    ca_file.chmod(0o644)
    key.chmod(0o600)
