"""The LISTEN connection: when it drops, waiters are woken to re-check and a waiter makes it
again, so a hand-over whose NOTIFY was lost still reaches its waiter at once; without any
LISTEN connection (listen=off, or an unreachable listen_url) waiters poll with a short
backoff."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

import turnstile
from turnstile._core import timing
from turnstile._sync.backends.postgres_listen import POLL_MAX

from ._cluster import Cluster
from ._util import schema_url, unique, wait_for

pytestmark = pytest.mark.postgres


def _blocked_acquire(lock: Any, out: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        try:
            lease = lock.acquire(timeout=30)
            out["at"] = time.monotonic()
            out["token"] = lease.token
            lease.release()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_for(predicate: Any, what: str) -> None:
    """wait_for with room for a reconnection of the LISTEN connection."""
    wait_for(predicate, what, timeout=20.0)


def _terminate(server: str, application_name: str) -> int:
    with psycopg.connect(server, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (application_name,),
        ).fetchall()
    return len(rows)


@pytest.mark.parametrize("release_while_down", [True, False])
def test_dropped_listen_connection(
    pg_cluster: Cluster, release_while_down: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timing, "MAX_BLOCKING_WAIT_TTL", 30.0)  # heartbeat 10 s apart (below)
    uid = unique()
    app = f"ttlisten-{uid}"
    holder_client = turnstile.connect(schema_url(pg_cluster.url, uid))
    client = turnstile.connect(schema_url(pg_cluster.url, uid, application_name=app))
    try:
        name = "listen:drop"
        assert holder_client.lock(name, ttl=30).try_acquire("first").acquired
        out: dict[str, Any] = {}
        thread = _blocked_acquire(client.lock(name, ttl=30), out)
        listener = client.backend.listener  # type: ignore[attr-defined]
        _wait_for(lambda: listener.up and holder_client.lock(name).status().waiters,
                  "the waiter never listened and joined the line")
        assert listener.connects == 1
        assert _terminate(pg_cluster.url, app + ":listen") == 1
        if not release_while_down:
            _wait_for(lambda: listener.connects == 2 and listener.up, "no reconnection")
        released = time.monotonic()
        assert holder_client.lock(name).release("first")
        thread.join(30)
        assert "error" not in out, out.get("error")
        # Far sooner than the waiter's own heartbeat (wait_ttl / 3 = 10 s here): by the NOTIFY,
        # or by the polls (at most POLL_MAX apart) while the connection is down; slack for a
        # busy machine.
        assert out["at"] - released < POLL_MAX + 2.0, out["at"] - released
        # Nobody reads the LISTEN connection while nobody waits: the next waiter makes it
        # again (if the last one did not), and is woken on it.
        assert holder_client.lock(name, ttl=30).try_acquire("second").acquired
        again: dict[str, Any] = {}
        thread = _blocked_acquire(client.lock(name, ttl=30), again)
        _wait_for(lambda: listener.connects == 2 and listener.up, "no reconnection")
        _wait_for(lambda: holder_client.lock(name).status().waiters, "no second waiter")
        time.sleep(0.1)  # (its step named the channel: it listens again)
        released = time.monotonic()
        assert holder_client.lock(name).release("second")
        thread.join(30)
        assert "error" not in again, again.get("error")
        assert again["at"] - released < 2.0, again["at"] - released
    finally:
        client.close()
        holder_client.close()


@pytest.mark.parametrize("how", ["listen=off", "unreachable listen_url"])
def test_waiters_without_listen_poll(
    pg_cluster: Cluster, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The waiter's own heartbeat (a step every wait_ttl / 3) made 10 s apart, so that only its
    # polling can pick the grant up within the bound below, however busy the machine.
    monkeypatch.setattr(timing, "MAX_BLOCKING_WAIT_TTL", 30.0)
    uid = unique()
    params = (
        {"listen": "off"}
        if how == "listen=off"
        else {"listen_url": "postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=1"}
    )
    holder_client = turnstile.connect(schema_url(pg_cluster.url, uid))
    client = turnstile.connect(schema_url(pg_cluster.url, uid, **params))
    try:
        name = "listen:none"
        for _ in range(3):
            assert holder_client.lock(name, ttl=30).try_acquire("first").acquired
            out: dict[str, Any] = {}
            thread = _blocked_acquire(client.lock(name, ttl=30), out)
            _wait_for(lambda: holder_client.lock(name).status().waiters, "no waiter")
            time.sleep(0.5)  # let the waiter's backoff grow to its cap
            released = time.monotonic()
            assert holder_client.lock(name).release("first")
            thread.join(30)
            assert "error" not in out, out.get("error")
            # A poll at most POLL_MAX apart finds the grant, with slack for a busy machine; a
            # waiter that did not poll would wait for its heartbeat, 10 s.
            assert out["at"] - released < POLL_MAX + 2.0, out["at"] - released
        listener = client.backend.listener  # type: ignore[attr-defined]
        assert listener is None if how == "listen=off" else not listener.up
    finally:
        client.close()
        holder_client.close()


async def test_async_listener_reconnects(
    pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The async flavour: a dropped LISTEN connection is made again by a waiting task; a
    waiter blocked in ``await lock.acquire()`` still gets the hand-over at once."""
    import asyncio

    monkeypatch.setattr(timing, "MAX_BLOCKING_WAIT_TTL", 30.0)  # heartbeat 10 s apart (below)

    import turnstile.aio

    uid = unique()
    app = f"ttalisten-{uid}"
    holder_client = await turnstile.aio.connect(schema_url(pg_cluster.url, uid))
    client = await turnstile.aio.connect(schema_url(pg_cluster.url, uid, application_name=app))
    try:
        name = "alisten"
        assert (await holder_client.lock(name, ttl=30).try_acquire("first")).acquired
        waiting = asyncio.ensure_future(client.lock(name, ttl=30).acquire(timeout=30))
        listener = client.backend.listener  # type: ignore[attr-defined]
        for _ in range(2000):
            if listener.up and (await holder_client.lock(name).status()).waiters:
                break
            await asyncio.sleep(0.01)
        assert listener.up
        await asyncio.to_thread(_terminate, pg_cluster.url, app + ":listen")
        released = time.monotonic()
        assert await holder_client.lock(name).release("first")
        lease = await asyncio.wait_for(waiting, 30)
        # Far sooner than the waiter's heartbeat (10 s here), with slack for a busy machine.
        assert time.monotonic() - released < POLL_MAX + 2.0
        await lease.release()
        # The next waiter makes the LISTEN connection again (nobody reads it meanwhile).
        assert (await holder_client.lock(name, ttl=30).try_acquire("second")).acquired
        waiting = asyncio.ensure_future(client.lock(name, ttl=30).acquire(timeout=30))
        for _ in range(2000):
            if listener.connects >= 2 and listener.up:
                break
            await asyncio.sleep(0.01)
        assert listener.connects >= 2 and listener.up
        assert await holder_client.lock(name).release("second")
        await (await asyncio.wait_for(waiting, 30)).release()
    finally:
        await client.close()
        await holder_client.close()


def test_closing_a_client_stops_a_waiter_reading_its_listen_connection(pg_url: str) -> None:
    """The client's waiters read the LISTEN connection themselves: no listening thread. A
    waiter blocked reading it (a read lasts up to READ_SLICE) stops at once when the client
    is closed under it, and frees nothing that the close frees."""
    from turnstile._sync.backends.wakeups import READ_SLICE

    holder_client = turnstile.connect(pg_url)
    client = turnstile.connect(pg_url)
    try:
        assert holder_client.lock("closing", ttl=30).try_acquire("first").acquired
        out: dict[str, Any] = {}
        thread = _blocked_acquire(client.lock("closing", ttl=30), out)
        listener = client.backend.listener  # type: ignore[attr-defined]
        _wait_for(lambda: listener.up and holder_client.lock("closing").status().waiters,
                  "the waiter never listened and joined the line")
        assert not [t for t in threading.enumerate() if "listen" in t.name]
        time.sleep(0.2)  # well into its read
        closing = time.monotonic()
        client.close()
        thread.join(30)
        # Stopped by the shut socket, not at the end of its read slice.
        assert time.monotonic() - closing < READ_SLICE - 1.0
        assert isinstance(out.get("error"), turnstile.BackendUnavailable), out
    finally:
        client.close()
        holder_client.lock("closing").release("first")
        holder_client.close()
