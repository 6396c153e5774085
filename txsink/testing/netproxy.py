"""A small loopback TCP proxy that tests put in front of a server to inject network faults.

Why a proxy and not firewall rules: tests run unprivileged and in parallel, and a proxy can
cut, stall or slow one client's path to a server while every other client is unaffected.

Modes (all take effect at once, for live and new connections):

* ``cut()``   close every live connection (with a TCP reset) and refuse new ones
              (the listening socket is closed, so connects get ECONNREFUSED);
* ``stall()`` keep connections open but forward no bytes (a hung network or a frozen peer);
* ``slow(s)`` forward, but delay every chunk by ``s`` seconds in each direction;
* ``heal()``  back to normal forwarding (re-opens the same port after a cut).

Usage::

    with NetProxy("127.0.0.1", 55432) as proxy:      # or proxy.start() / proxy.stop()
        dsn = f"postgresql://u:p@127.0.0.1:{proxy.port}/db"
        ...
        proxy.cut()
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from enum import Enum
from types import TracebackType

__all__ = ["LOOPBACK", "Mode", "NetProxy", "ProxyStats"]

LOOPBACK = "127.0.0.1"
_CHUNK = 65536
_TICK = 0.05


class Mode(Enum):
    FORWARD = "forward"
    SLOW = "slow"
    STALL = "stall"
    CUT = "cut"


@dataclass
class ProxyStats:
    """Counters a test can assert on (e.g. that traffic really went through the proxy)."""

    accepted: int = 0
    refused_during_cut: int = 0
    bytes_to_server: int = 0
    bytes_to_client: int = 0
    active: int = 0


def _reset_close(sock: socket.socket) -> None:
    """Close with SO_LINGER 0 so the peer sees a reset, like a dropped network path."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Connection:
    """One client connection and its upstream socket, pumped by two threads."""

    def __init__(self, proxy: NetProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.closed = threading.Event()
        self._done = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        for src, dst, up in ((self.client, self.server, True), (self.server, self.client, False)):
            threading.Thread(
                target=self._pump, args=(src, dst, up), name="netproxy-pump", daemon=True
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_server: bool) -> None:
        try:
            while not self.closed.is_set():
                if not self.proxy._wait_forwarding(self.closed):
                    continue
                try:
                    readable, _, _ = select.select([src], [], [], _TICK)
                except (OSError, ValueError):
                    break
                if not readable:
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    break
                delay = self.proxy._delay()
                if delay > 0:
                    self.closed.wait(delay)
                # A stall that started while this chunk was in flight holds it back too.
                while not self.closed.is_set() and not self.proxy._wait_forwarding(self.closed):
                    pass
                if self.closed.is_set():
                    break
                dst.sendall(data)
                self.proxy._count(len(data), to_server)
        except OSError:
            pass
        finally:
            with self._lock:
                self._done += 1
                finished = self._done == 2
            if finished or self.closed.is_set():
                self.close(reset=False)

    def close(self, *, reset: bool) -> None:
        if self.closed.is_set() and not reset:
            self.proxy._forget(self)
            return
        self.closed.set()
        for sock in (self.client, self.server):
            if reset:
                _reset_close(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()
        self.proxy._forget(self)


class NetProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port`` with switchable faults."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_port: int = 0,
        connect_timeout: float = 5.0,
    ) -> None:
        self.target = (target_host, target_port)
        self._listen_port = listen_port
        self._connect_timeout = connect_timeout
        self._mode = Mode.FORWARD
        self._slow_s = 0.0
        self._cond = threading.Condition()
        self._conns: set[_Connection] = set()
        self._listener: socket.socket | None = None
        self._listener_open = threading.Event()
        self._listener_closed = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = ProxyStats()

    # -- lifecycle -------------------------------------------------------------------

    @property
    def port(self) -> int:
        if not self._listen_port:
            raise RuntimeError("proxy not started")
        return self._listen_port

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def mode(self) -> Mode:
        return self._mode

    def start(self) -> int:
        """Bind the loopback port (0 = any free one) and start forwarding; returns the port."""
        if self._thread is not None:
            return self.port
        self._open_listener()
        self._thread = threading.Thread(target=self._accept_loop, name="netproxy", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        """Close everything; the proxy cannot be restarted."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close_listener()
        for conn in list(self._conns):
            conn.close(reset=False)

    def __enter__(self) -> NetProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- faults ----------------------------------------------------------------------

    def cut(self) -> None:
        """Reset every live connection and refuse new ones until ``heal()``."""
        if self._mode is not Mode.CUT:
            self._listener_closed.clear()
        self._set_mode(Mode.CUT)
        for conn in list(self._conns):
            conn.close(reset=True)
        # Return only once new connects are really refused.
        self._listener_closed.wait(timeout=5)

    def stall(self) -> None:
        """Keep connections open but stop forwarding bytes in both directions."""
        self._set_mode(Mode.STALL)

    def slow(self, delay_s: float) -> None:
        """Delay every forwarded chunk by ``delay_s`` seconds (each direction)."""
        self._slow_s = max(0.0, float(delay_s))
        self._set_mode(Mode.SLOW)

    def heal(self) -> None:
        """Forward normally again; after a cut the same port accepts connections again."""
        was_cut = self._mode is Mode.CUT
        if was_cut:
            self._listener_open.clear()
        self._slow_s = 0.0
        self._set_mode(Mode.FORWARD)
        if was_cut and not self._listener_open.wait(timeout=10):
            raise RuntimeError(f"netproxy could not re-open port {self._listen_port}")

    # -- internals used by connections ------------------------------------------------

    def _set_mode(self, mode: Mode) -> None:
        with self._cond:
            self._mode = mode
            self._cond.notify_all()

    def _wait_forwarding(self, closed: threading.Event) -> bool:
        """True when bytes may flow; otherwise waits a tick (stalled) and returns False."""
        with self._cond:
            if self._mode is Mode.STALL and not closed.is_set() and not self._stopping.is_set():
                self._cond.wait(_TICK)
                return False
            return True

    def _is_cut(self) -> bool:
        return self._mode is Mode.CUT

    def _delay(self) -> float:
        return self._slow_s if self._mode is Mode.SLOW else 0.0

    def _count(self, n: int, to_server: bool) -> None:
        with self._cond:
            if to_server:
                self.stats.bytes_to_server += n
            else:
                self.stats.bytes_to_client += n

    def _forget(self, conn: _Connection) -> None:
        with self._cond:
            self._conns.discard(conn)
            self.stats.active = len(self._conns)

    def _open_listener(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 5
        while True:
            try:
                sock.bind((LOOPBACK, self._listen_port))
                break
            except OSError:
                if not self._listen_port or time.monotonic() > deadline:
                    sock.close()
                    raise
                time.sleep(_TICK)
        sock.listen(128)
        sock.settimeout(_TICK)
        self._listen_port = int(sock.getsockname()[1])
        self._listener = sock
        self._listener_closed.clear()
        self._listener_open.set()

    def _close_listener(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
            self._listener = None
        self._listener_open.clear()
        self._listener_closed.set()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            if self._mode is Mode.CUT:
                if self._listener is not None:
                    # Drain connections the kernel completed before we closed: reset them.
                    self._drain_backlog()
                    self._close_listener()
                self._listener_closed.set()
                time.sleep(_TICK)
                continue
            if self._listener is None:
                try:
                    self._open_listener()
                except OSError:
                    time.sleep(_TICK)
                    continue
            listener = self._listener
            if listener is None:  # closed by another thread meanwhile
                continue
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    break
                continue
            if self._is_cut():  # cut() between accept() and here
                self.stats.refused_during_cut += 1
                _reset_close(client)
                continue
            self._connect(client)

    def _drain_backlog(self) -> None:
        listener = self._listener
        if listener is None:
            return
        listener.settimeout(0)
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                break
            self.stats.refused_during_cut += 1
            _reset_close(client)

    def _connect(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target, timeout=self._connect_timeout)
        except OSError:
            _reset_close(client)
            return
        for sock in (client, server):
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Connection(self, client, server)
        with self._cond:
            self._conns.add(conn)
            self.stats.accepted += 1
            self.stats.active = len(self._conns)
        conn.start()
