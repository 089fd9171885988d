"""The Redis servers these fault tests control, and a TCP proxy that loses replies.

The servers come from the shared starter (``scripts/servers.py``): real ``redis-server``
processes on free ports, in the test's temporary folder, that the tests may kill, restart
and flush because nobody else uses them. What is test-only lives here: a redis-py admin
connection, command statistics, slot moves and the cutting proxy.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
import redis

from scripts import servers
from scripts.servers import free_port

__all__ = [
    "CuttingProxy",
    "RedisProcess",
    "free_port",
    "move_slot",
    "redis_cluster",
    "redis_process",
    "wait_until",
]


def _skip_or_fail(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class RedisProcess(servers.RedisServer):
    """One redis-server of our own (see ``servers.RedisServer``), with a redis-py admin
    connection. Without a redis-server binary the test is skipped (failed under CI)."""

    def start(self) -> None:
        try:
            super().start()
        except servers.Unavailable as exc:
            _skip_or_fail(f"{exc} (scripts/dev.py test puts one on PATH)")

    def admin(self, timeout: float = 5) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_timeout=timeout)

    def commandstats(self, *, raw: bool = False) -> dict[str, int]:
        """Calls per command. Unless ``raw``, the calls that run a Turnstile step, whether
        as a script (EVALSHA) or as a function (FCALL), are counted together as "script"."""
        with contextlib.closing(self.admin()) as r:
            stats = r.info("commandstats")
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
        if not raw:
            runs = calls.pop("evalsha", 0) + calls.pop("fcall", 0)
            if runs:
                calls["script"] = runs
        return calls


@contextlib.contextmanager
def redis_process(folder: Path, *options: str) -> Iterator[RedisProcess]:
    server = RedisProcess(folder, *options)
    try:
        server.start()
        yield server
    finally:
        server.close()


class CuttingProxy:
    """A TCP proxy between clients and a Redis server that can lose a reply on purpose.

    ``cut_reply_after(marker)``: the next request (client to server) that contains ``marker``
    is forwarded to the server, which runs it, but the server's reply is thrown away and the
    client's connection is closed, as when a network drops between the two. ``refuse`` makes
    it close every new connection at once (the server looks unreachable).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self.cuts = 0
        self.refuse = False
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cut_reply_after(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        cut_pending = False
        try:
            while True:
                ready, _, _ = select.select([client, server], [], [], 0.5)
                if self._closed:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        with self._lock:
                            if self._marker is not None and self._marker in data:
                                self._marker = None
                                cut_pending = True
                        server.sendall(data)
                    elif cut_pending:
                        # The server ran the request; its reply is lost with the connection.
                        self.cuts += 1
                        return
                    else:
                        client.sendall(data)
        except (OSError, ValueError):  # ValueError: select() on a socket closed meanwhile
            return
        finally:
            for s in (client, server):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@contextlib.contextmanager
def redis_cluster(folder: Path, masters: int = 3) -> Iterator[list[RedisProcess]]:
    """A Redis Cluster of our own: ``masters`` nodes, no replicas, slots split evenly."""
    cluster = servers.RedisClusterServers(masters, folder, node_class=RedisProcess)
    try:
        cluster.start()
        yield cast(list[RedisProcess], cluster.nodes)  # made by node_class=RedisProcess
    finally:
        cluster.close()


def move_slot(nodes: list[RedisProcess], slot: int) -> tuple[RedisProcess, RedisProcess]:
    """Reshard one slot, keys and all, from its owner to another master (as
    ``redis-cli --cluster reshard`` does). Returns (source, destination)."""
    ids = {}
    owner = None
    for node in nodes:
        with contextlib.closing(node.admin()) as r:
            ids[node.port] = r.execute_command("CLUSTER", "MYID").decode()
    with contextlib.closing(nodes[0].admin()) as r:
        for start, end, master, *_ in r.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                owner = next(n for n in nodes if n.port == int(master[1]))
    assert owner is not None
    target = next(n for n in nodes if n is not owner)
    with contextlib.closing(target.admin()) as dst, contextlib.closing(owner.admin()) as src:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[owner.port])
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])
        while True:
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        for node in nodes:
            with contextlib.closing(node.admin()) as r:
                r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target.port])
    return owner, target
