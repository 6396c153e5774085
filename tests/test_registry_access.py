"""The Schema Registry's refusals of credentials and rights, without a registry: the
messages name the fix, and a URL's ``user:password@`` never reaches a message."""

from __future__ import annotations

from txsink.connectors.kafka.records.avro import AvroEncoder, access_refused, safe_url


def test_safe_url_drops_user_info() -> None:
    assert safe_url("https://app:s3cret@reg:8081/x") == "https://reg:8081/x"
    assert safe_url("https://reg:8081") == "https://reg:8081"
    encoder = AvroEncoder("value", {"url": "http://app:s3cret@reg:8081"}, None, None)
    assert "s3cret" not in encoder.url


def test_access_refused_names_the_fix_per_status() -> None:
    unauthorized = access_refused("https://reg", 401, "registering")
    forbidden = access_refused("https://reg", 403, "registering")
    assert unauthorized is not None and "basic.auth.user.info" in unauthorized
    assert forbidden is not None and "developer" in forbidden and "docs/security.md" in forbidden
    assert access_refused("https://reg", 409, "registering") is None
    assert access_refused("https://reg", 500, "registering") is None
