"""Throwaway Redis servers and a TCP proxy that these fault tests control.

The servers are real ``redis-server`` processes found on PATH (``scripts/dev.py test`` puts
the one it uses there), on free ports, in the test's temporary folder: the tests may kill,
restart and flush them because nobody else uses them.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        message = "redis-server is not on PATH (scripts/dev.py test puts one there)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    """A free port p <= 55535 whose cluster bus port p + 10000 is free too."""
    for _ in range(200):
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisProcess:
    """One redis-server of our own. ``kill()`` is kill -9; ``start()`` again reuses the
    port and folder, so an append-only file is read back."""

    def __init__(self, folder: Path, *options: str) -> None:
        opts = list(options)
        self.password = opts[opts.index("--requirepass") + 1] if "--requirepass" in opts else None
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.options = list(options)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.folder),
            "--logfile",
            str(self.folder / "redis.log"),
            "--save",
            "",
            *self.options,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                with contextlib.closing(self.admin(timeout=1)) as r:
                    if r.ping():
                        return
            except redis.exceptions.BusyLoadingError:
                pass
            except redis.exceptions.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.folder / "redis.log").read_text(errors="replace")[-2000:]
                self.kill()  # never leave a half-started server behind
                raise RuntimeError(f"redis-server did not start: {log}")
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def admin(self, timeout: float = 5) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, socket_timeout=timeout)

    def commandstats(self) -> dict[str, int]:
        with contextlib.closing(self.admin()) as r:
            stats = r.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


@contextlib.contextmanager
def redis_process(folder: Path, *options: str) -> Iterator[RedisProcess]:
    server = RedisProcess(folder, *options)
    try:
        server.start()
        yield server
    finally:
        server.kill()


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
    nodes = []
    try:
        for i in range(masters):
            node = RedisProcess(
                folder / f"node{i}",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(folder / f"node{i}" / "nodes.conf"),
                "--cluster-node-timeout",
                "5000",
                "--appendonly",
                "no",
            )
            node.port = free_cluster_port()
            nodes.append(node)
            node.start()
        per = 16384 // masters
        for i, node in enumerate(nodes):
            last = 16383 if i == masters - 1 else (i + 1) * per - 1
            with contextlib.closing(node.admin()) as r:
                r.execute_command("CLUSTER", "ADDSLOTS", *range(i * per, last + 1))
                for other in nodes:
                    if other is not node:
                        r.execute_command("CLUSTER", "MEET", "127.0.0.1", other.port)

        def ready() -> bool:
            for node in nodes:
                with contextlib.closing(node.admin()) as r:
                    info = r.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if "cluster_state:ok" not in text:
                        return False
                    if len(r.execute_command("CLUSTER", "NODES").splitlines()) < masters:
                        return False
            return True

        if not wait_until(ready, 30, 0.1):
            raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
        time.sleep(0.5)  # every node sees every slot assigned
        yield nodes
    finally:
        for node in nodes:
            node.kill()


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
