"""The small contract every local service implements, so the manager can treat them alike."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from .common import StartReport


class LocalService(ABC):
    """One server process on 127.0.0.1, with its state kept in ``.work/state.json``.

    ``state`` is the service's own JSON-able dict (ports, pid marker, flavour); the manager
    stores it between runs so ``up`` can reuse ports and ``down`` can find the process.
    """

    name: str

    @abstractmethod
    def up(self, state: dict[str, Any], taken_ports: set[int]) -> StartReport:
        """Start the server if it is not running (idempotent) and update ``state`` in place."""

    @abstractmethod
    def down(self, state: dict[str, Any]) -> bool:
        """Stop the server by its pid file; True if something was stopped."""

    @abstractmethod
    def running(self, state: dict[str, Any]) -> bool:
        """True if our process is alive (not necessarily healthy)."""

    @abstractmethod
    def healthy(self, state: dict[str, Any]) -> bool:
        """True if the server answers a real client request."""

    @abstractmethod
    def env(self, state: dict[str, Any]) -> dict[str, str]:
        """The TXSINK_* variables that point a test run at this server."""

    def ports(self, state: dict[str, Any]) -> set[int]:
        """Ports this service holds (so others do not pick them)."""
        return {int(v) for k, v in state.items() if k.endswith("port") and isinstance(v, int)}
