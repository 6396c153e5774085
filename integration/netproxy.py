"""The loopback fault proxy now ships in the package: :mod:`txsink.testing.netproxy`."""

from txsink.testing.netproxy import LOOPBACK, Mode, NetProxy

__all__ = ["LOOPBACK", "Mode", "NetProxy"]
