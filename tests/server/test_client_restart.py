"""The HTTP client rides out a restart of the service (issue 17, points 7 and 10): waiters
blocked in ``acquire(timeout=40)`` while `turnstile serve` stops and starts again on the same
port and store keep their places in line and get their grants after the restart, in order,
in both flavours. This is the "store restart under blocked waiters" fault test of the HTTP
backend."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import turnstile
import turnstile.aio
from tests.http_server import ServerProcess, start_server
from turnstile._core import timing

DOWN = 1.5  # seconds the service is away


def _restart(server: ServerProcess, tmp: Path, store: str) -> ServerProcess:
    port = server.base.rsplit(":", 1)[1]
    server.stop()
    time.sleep(DOWN)
    again = start_server(store, tmp, tokens=[{"name": "admin", "admin": True,
                                              "secret": server.tokens["admin"]}],
                         args=("--port", port, "--max-wait", "10"))
    assert again.base == server.base
    return again


def _line(server: ServerProcess) -> list[str]:
    status = httpx.post(server.base + "/v1/locks/status", json={"name": "x"},
                        headers={"Authorization": f"Bearer {server.tokens['admin']}"}).json()
    return [w["holder"] for w in status["waiters"]]


def _wait_for_line(server: ServerProcess, expected: list[str]) -> None:
    deadline = time.monotonic() + 20
    while _line(server) != expected:
        assert time.monotonic() < deadline, _line(server)
        time.sleep(0.05)


@pytest.fixture
def places_outlast_the_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """A blocked waiter's place lasts MAX_BLOCKING_WAIT_TTL (5 s) after its last step. The
    service is away DOWN seconds plus its start, which on a loaded machine took long enough
    for the places to lapse (the line was empty after the restart): here they last 30 s, far
    longer than any restart, so the test shows the waiters coming back, not the machine's
    speed."""
    monkeypatch.setattr(timing, "MAX_BLOCKING_WAIT_TTL", 30.0)


def test_sync_waiters_get_their_grants_after_a_restart(
    tmp_path: Path, places_outlast_the_restart: None
) -> None:
    store = f"sqlite:///{tmp_path}/restart.db"
    server = start_server(store, tmp_path, tokens=[{"name": "admin", "admin": True}],
                          args=("--max-wait", "10"))
    url = server.url("admin")
    holder = turnstile.connect(url)
    clients = [turnstile.connect(url) for _ in range(2)]
    results: dict[str, Any] = {}
    try:
        lease = holder.lock("x", ttl=30).acquire_nowait(holder="H")

        def wait(i: int) -> None:
            started = time.monotonic()
            try:
                got = clients[i].lock("x", ttl=30).acquire(timeout=40, holder=f"W{i}")
                results[f"W{i}"] = (got.token, time.monotonic() - started)
                time.sleep(0.3)
                got.release()
            except BaseException as exc:  # reported below
                results[f"W{i}"] = exc

        threads = []
        for i in range(2):
            threads.append(threading.Thread(target=wait, args=(i,)))
            threads[-1].start()
            _wait_for_line(server, [f"W{j}" for j in range(i + 1)])

        server = _restart(server, tmp_path, store)
        # Same line after the restart: the places are the store's, kept by the waiters' steps.
        assert _line(server) == ["W0", "W1"]
        time.sleep(1.0)  # the waiters are back in their long polls on the new instance
        assert _line(server) == ["W0", "W1"]
        lease.release()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()
        for i in range(2):
            assert not isinstance(results[f"W{i}"], BaseException), results
        # Granted in order, each well before its 40 s timeout.
        assert results["W0"][0] < results["W1"][0]
        assert all(results[w][1] < 20 for w in ("W0", "W1")), results
        assert "Traceback" not in server.output()
    finally:
        for client in [holder, *clients]:
            client.close()
        server.stop()


def test_async_waiter_gets_its_grant_after_a_restart(
    tmp_path: Path, places_outlast_the_restart: None
) -> None:
    store = f"sqlite:///{tmp_path}/restart.db"
    server = start_server(store, tmp_path, tokens=[{"name": "admin", "admin": True}],
                          args=("--max-wait", "10"))

    async def scenario() -> tuple[int, int, float]:
        nonlocal server
        url = server.url("admin")
        holder = await turnstile.aio.connect(url)
        waiter = await turnstile.aio.connect(url)
        try:
            lease = await holder.lock("x", ttl=30).acquire_nowait(holder="H")
            started = time.monotonic()
            waiting = asyncio.ensure_future(
                waiter.lock("x", ttl=30).acquire(timeout=40, holder="W")
            )
            await asyncio.to_thread(_wait_for_line, server, ["W"])
            server = await asyncio.to_thread(_restart, server, tmp_path, store)
            await asyncio.sleep(1.0)
            assert not waiting.done()
            assert await asyncio.to_thread(_line, server) == ["W"]
            await lease.release()
            got = await asyncio.wait_for(waiting, 30)
            elapsed = time.monotonic() - started
            token = got.token
            await got.release()
            return lease.token, token, elapsed
        finally:
            await holder.close()
            await waiter.close()

    try:
        first, second, elapsed = asyncio.run(scenario())
        assert second > first and elapsed < 20
    finally:
        server.stop()


def test_a_service_that_stays_away_fails_within_the_budget(tmp_path: Path) -> None:
    """Retrying is bounded: with the service gone for good a call fails with
    BackendUnavailable after about the client's timeout, not at once and not forever."""
    store = f"sqlite:///{tmp_path}/gone.db"
    server = start_server(store, tmp_path, tokens=[{"name": "admin", "admin": True}])
    client = turnstile.connect(server.url("admin"), timeout=2)
    try:
        lock = client.lock("x", ttl=5)
        server.stop()
        started = time.monotonic()
        with pytest.raises(turnstile.BackendUnavailable):
            lock.try_acquire("h")
        assert 1.5 <= time.monotonic() - started < 10
    finally:
        client.close()
        server.stop()


class ReplyDropper:
    """A TCP proxy in front of the service that loses the reply to chosen requests: the
    request reaches the service (which acts on it), then the client's connection is closed
    instead of getting the answer. The client sees a reset, as after a crash mid-reply."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.drops: dict[bytes, int] = {}  # path -> replies still to drop
        self.dropped: list[bytes] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def drop(self, path: str, count: int = 1) -> None:
        with self._lock:
            self.drops[path.encode()] = count

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            doomed = threading.Event()
            threading.Thread(target=self._up, args=(client, server, doomed), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, doomed),
                             daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, doomed: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    for path, left in self.drops.items():
                        if left > 0 and b" " + path + b" HTTP/" in data:
                            self.drops[path] = left - 1
                            self.dropped.append(path)
                            doomed.set()  # before the request can be answered
                server.sendall(data)
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _down(self, server: socket.socket, client: socket.socket,
              doomed: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if doomed.is_set():
                    break  # the service answered; the client never hears it
                client.sendall(data)
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


def test_a_lost_reply_is_retried_safely(tmp_path: Path) -> None:
    """Each lock operation whose reply is lost after the service acted on it is retried, and
    the repeat is harmless: the same lease (same token) for the holder, one holder only; a
    renewal extends the same lease; a release leaves the name free and raises nothing."""
    server = start_server(f"sqlite:///{tmp_path}/lost.db", tmp_path,
                          tokens=[{"name": "admin", "admin": True}])
    host, port = server.base.removeprefix("http://").split(":")
    proxy = ReplyDropper((host, int(port)))
    client = turnstile.connect(f"http://:{server.tokens['admin']}@127.0.0.1:{proxy.port}")
    try:
        sem = client.semaphore("lost", 2, ttl=30)
        proxy.drop("/v1/semaphores/try-acquire")
        ticket = sem.try_acquire("H")
        assert proxy.dropped == [b"/v1/semaphores/try-acquire"]
        assert ticket.acquired and ticket.lease is not None
        status = sem.status()
        assert [(h.holder, h.token) for h in status.holders] == [("H", ticket.lease.token)]

        lock = client.lock("lost-lock", ttl=30)
        assert lock.try_acquire("A").acquired
        proxy.drop("/v1/semaphores/try-acquire")
        second = lock.try_acquire("B")
        assert second.position == 0  # one place in line, not two
        assert [w.holder for w in lock.status().waiters] == ["B"]

        proxy.drop("/v1/semaphores/renew")
        renewed = lock.renew("A", lock.status().holders[0].token, 20)
        assert renewed.token == lock.status().holders[0].token

        proxy.drop("/v1/semaphores/release")
        lock.release("A", renewed.token)  # no error though the first reply was lost
        proxy.drop("/v1/semaphores/release")
        ticket.lease.release()
        assert sem.status().holders == ()
        # B was granted by A's release: its next ask claims it.
        assert lock.try_acquire("B").acquired
        assert len(proxy.dropped) == 5, proxy.dropped
    finally:
        client.close()
        proxy.close()
        server.stop()


def test_a_lost_wait_reply_still_hands_over_promptly_and_fenced(tmp_path: Path) -> None:
    """The HTTP client's wait step (the long poll between try-acquire steps) loses its reply
    just as the hand-over wakes it: the waiter still gets the lease promptly, with about its
    whole ttl ahead, exactly once, and every hold is checked against a fenced resource
    (tokens increase, holds never overlap, a stale token is refused)."""
    from tests.faults.test_dropped_replies import Fence, _hold

    server = start_server(f"sqlite:///{tmp_path}/wait.db", tmp_path,
                          tokens=[{"name": "admin", "admin": True}])
    host, port = server.base.removeprefix("http://").split(":")
    proxy = ReplyDropper((host, int(port)))
    secret = server.tokens["admin"]
    through = turnstile.connect(f"http://:{secret}@127.0.0.1:{proxy.port}")
    direct = turnstile.connect(f"http://:{secret}@{host}:{port}")
    ttl = 30.0
    try:
        fence = Fence()
        holder = direct.lock("job", ttl=ttl).acquire(timeout=10, holder="holder")
        fence.write(holder.token)
        proxy.drop("/v1/semaphores/wait")
        got: dict[str, Any] = {}

        def waiter() -> None:
            try:
                with through.lock("job", ttl=ttl).acquire(timeout=60, holder="waiter") as lease:
                    got["at"] = time.monotonic()
                    got["remaining"] = lease.remaining
                    _hold(fence, lease)
            except BaseException as exc:
                got["error"] = exc

        thread = threading.Thread(target=waiter)
        thread.start()
        deadline = time.monotonic() + 30
        while proxy.dropped != [b"/v1/semaphores/wait"]:  # the long poll is under way
            assert time.monotonic() < deadline, "the waiter never sent its wait step"
            time.sleep(0.01)
        fence.done(holder.token)
        released = time.monotonic()
        assert holder.release()
        thread.join(60)
        assert not thread.is_alive()
        assert "error" not in got, repr(got.get("error"))
        assert got["at"] - released < 2.0, got["at"] - released
        assert got["remaining"] >= ttl - (got["at"] - released) - 1.0, got
        with pytest.raises(AssertionError, match="stale token"):
            fence.write(holder.token)  # the fence refuses the older holder's token
        fence.check()
        status = direct.lock("job").status()
        assert status.holders == () and status.waiters == ()
    finally:
        through.close()
        direct.close()
        proxy.close()
        server.stop()


def test_overloaded_answers_are_retried_after_retry_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At its connection limit the service answers 503 overloaded with Retry-After: 1; the
    client waits that long between tries (not its 50 ms first backoff) and succeeds once a
    connection is free, within its budget."""
    server = start_server(f"sqlite:///{tmp_path}/busy.db", tmp_path,
                          tokens=[{"name": "admin", "admin": True}],
                          args=("--max-connections", "2", "--keep-alive", "0.2",
                                "--header-timeout", "30"))
    client = turnstile.connect(server.url("admin"))
    host, port = server.base.removeprefix("http://").split(":")
    try:
        time.sleep(0.5)  # the handshake's kept-alive connection is closed by now
        idle = [socket.create_connection((host, int(port))) for _ in range(2)]

        def free() -> None:
            time.sleep(2.5)
            for sock in idle:
                sock.close()

        threading.Thread(target=free).start()
        started = time.monotonic()
        with caplog.at_level("DEBUG", logger="turnstile.http"):
            ticket = client.lock("busy", ttl=5).try_acquire("h")
        elapsed = time.monotonic() - started
        assert ticket.acquired
        assert 2.0 <= elapsed < 9, elapsed
        pauses = [float(m) for m in
                  re.findall(r"in ([\d.]+) s: .*too many connections", caplog.text)]
        assert pauses and all(p >= 1.0 for p in pauses), caplog.text
    finally:
        client.close()
        server.stop()
