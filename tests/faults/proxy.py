"""A TCP proxy between clients and a store (Redis or PostgreSQL) that loses one reply on
purpose, for the fault tests.

Every connection accepted on :attr:`FaultProxy.port` is forwarded to the store, byte for
byte, by one thread per connection. A fault armed with :meth:`FaultProxy.drop_next_reply`
fires on the next chunk the store sends back on a connection that matches it: the chunk is
thrown away and both sides of that connection are reset (RST), as when a network path dies
after the store ran a request and before its answer arrived. The store has done the work;
the client only sees its connection reset. Each fault fires once.

A connection matches when the requests it sent since its last reply contain
``request_marker`` (e.g. a holder name, a script's SHA1, ``b"BLPOP"``) and the reply chunk
contains ``reply_marker`` (e.g. a PostgreSQL NOTIFY channel name, a Redis client's wake-up
channel); either may be left out. The request bytes are remembered until the store answers,
so a fault armed while a request waits in the store (a blocked ``BLPOP``) fires on its
reply.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

__all__ = ["FaultProxy"]

HOST = "127.0.0.1"


@dataclass
class _Fault:
    request_marker: bytes | None
    reply_marker: bytes | None
    delay: float | None = None  # None: drop the reply; else: forward it this much later


class _Link:
    """One proxied connection: the client's socket, the store's, and the request bytes
    sent since the store last answered."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.pending = b""


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target_port`` and drops chosen replies."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server((HOST, 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._links: list[_Link] = []
        self._requests: list[bytes] = []  # every request chunk seen (for request_seen)
        self.drops = 0  # faults fired so far (dropped or delayed replies)
        self.dropped = threading.Event()  # set each time a fault fires
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="fault-proxy")
        self._thread.start()

    # -- what the tests call -------------------------------------------------------------------
    def drop_next_reply(
        self, request_marker: bytes | None = None, reply_marker: bytes | None = None
    ) -> None:
        """Arm one fault (see the module docstring)."""
        with self._lock:
            self._faults.append(_Fault(request_marker, reply_marker))
        self.dropped.clear()

    def delay_next_reply(
        self,
        seconds: float,
        request_marker: bytes | None = None,
        reply_marker: bytes | None = None,
    ) -> None:
        """Arm one slow reply: the next matching reply is forwarded ``seconds`` late (the
        store ran the request on time; its answer is slow to arrive)."""
        with self._lock:
            self._faults.append(_Fault(request_marker, reply_marker, seconds))
        self.dropped.clear()

    def armed(self) -> int:
        """Faults armed that have not fired yet."""
        with self._lock:
            return len(self._faults)

    def disarm(self) -> None:
        with self._lock:
            self._faults.clear()

    def request_count(self, marker: bytes) -> int:
        """How many request chunks containing ``marker`` the store has been sent so far."""
        with self._lock:
            return sum(1 for chunk in self._requests if marker in chunk)

    def wait_request(self, marker: bytes, after: int, timeout: float) -> bool:
        """Wait until more than ``after`` request chunks containing ``marker`` were sent."""
        deadline = time.monotonic() + timeout
        while self.request_count(marker) <= after:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            _reset(link.client)
            _reset(link.server)
        self._thread.join(5)

    # -- the forwarding ------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((HOST, self.target_port), timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._pump, args=(link,), daemon=True).start()

    def _take_fault(self, link: _Link, reply: bytes) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.request_marker is not None and fault.request_marker not in link.pending:
                    continue
                if fault.reply_marker is not None and fault.reply_marker not in reply:
                    continue
                self._faults.remove(fault)
                self.drops += 1
                return fault
        return None

    def _pump(self, link: _Link) -> None:
        client, server = link.client, link.server
        try:
            while not self._closed:
                ready, _, _ = select.select([client, server], [], [], 0.2)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        with self._lock:
                            link.pending += data
                            self._requests.append(data)
                        server.sendall(data)
                    else:
                        fault = self._take_fault(link, data)
                        if fault is not None and fault.delay is None:
                            # The store ran the request; its answer dies with the connection.
                            self.dropped.set()
                            return
                        if fault is not None and fault.delay is not None:
                            time.sleep(fault.delay)
                            self.dropped.set()
                        link.pending = b""
                        client.sendall(data)
        except (OSError, ValueError):  # ValueError: select() on a socket closed meanwhile
            return
        finally:
            _reset(client)
            _reset(server)
            with self._lock, contextlib.suppress(ValueError):
                self._links.remove(link)


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), not a polite FIN: the peer sees a reset."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
