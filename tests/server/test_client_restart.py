"""The HTTP client rides out a restart of the service (issue 17, points 7 and 10): waiters
blocked in ``acquire(timeout=40)`` while `turnstile serve` stops and starts again on the same
port and store keep their places in line and get their grants after the restart, in order,
in both flavours. This is the "store restart under blocked waiters" fault test of the HTTP
backend."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import turnstile
import turnstile.aio
from tests.http_server import ServerProcess, start_server

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


def test_sync_waiters_get_their_grants_after_a_restart(tmp_path: Path) -> None:
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


def test_async_waiter_gets_its_grant_after_a_restart(tmp_path: Path) -> None:
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
