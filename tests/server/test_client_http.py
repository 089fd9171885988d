"""The Python client's `http` backend: URLs, tokens, errors, and renewals under load."""

from __future__ import annotations

import asyncio
import time

import pytest

import turnstile
import turnstile.aio
from tests.server.conftest import Served


def test_token_sources_and_redaction(
    sqlite_served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = sqlite_served.server.tokens["tenant-a"]
    base = sqlite_served.server.base
    by_option = turnstile.connect(base, token=secret)
    by_url = turnstile.connect(sqlite_served.url("tenant-a"))
    monkeypatch.setenv("TURNSTILE_TOKEN", secret)
    by_env = turnstile.connect(base)
    try:
        for client in (by_option, by_url, by_env):
            assert client.backend.info["principal"]["name"] == "tenant-a"  # type: ignore[attr-defined]
        assert secret not in repr(by_url) and "***" in repr(by_url)
        assert "SQLite" in by_url.characteristics.description
        assert by_url.characteristics.durable and by_url.characteristics.cross_host
    finally:
        for client in (by_option, by_url, by_env):
            client.close()
    monkeypatch.delenv("TURNSTILE_TOKEN")
    with pytest.raises(turnstile.ConfigurationError, match="refused the token") as caught:
        turnstile.connect(base, token="wrong-token-wrong-token")
    assert "wrong-token" not in str(caught.value)
    with pytest.raises(turnstile.ConfigurationError, match="takes no query"):
        turnstile.connect(base + "/?token=x")
    with pytest.raises(turnstile.ConfigurationError, match="does not look like a Turnstile"):
        turnstile.connect(base + "/not-here", token=secret)


def test_errors_map_to_turnstile_exceptions(sqlite_served: Served) -> None:
    reader = turnstile.connect(sqlite_served.url("reader-a"))
    writer = turnstile.connect(sqlite_served.url("tenant-a"))
    try:
        with pytest.raises(turnstile.AccessDenied, match="read-only"):
            reader.lock("a:x").try_acquire("h")
        with pytest.raises(turnstile.AccessDenied, match="may only use names"):
            writer.lock("b:x").acquire(timeout=0)
        assert reader.lock("a:x").status().holders == ()
        with writer.lock("a:x", ttl=5).acquire(timeout=5) as lease:
            assert reader.lock("a:x").status().holders[0].token == lease.token
        with pytest.raises(turnstile.AcquireTimeout):
            held = writer.lock("a:y", ttl=5).acquire(timeout=1)
            writer.lock("a:y", ttl=5).acquire(timeout=0.2)
        held.release()
    finally:
        reader.close()
        writer.close()


async def test_long_polls_never_starve_a_renewal(sqlite_served: Served) -> None:
    """More long polls at once than one connection pool holds (httpx: 100): renewals and
    steps still go through at once, because long polls use connections of their own."""
    client = await turnstile.aio.connect(sqlite_served.url("writer"))
    backend = client.backend
    try:
        # Unrenewed until the renewal below: it lasts while the 120 waiters are set up.
        lease = await client.lock("crowd", ttl=120).acquire(timeout=5, holder="owner")
        waiters = [await backend.open_waiter("crowd", f"w{i}") for i in range(120)]
        polls = [asyncio.ensure_future(w.wait(10)) for w in waiters]
        await asyncio.sleep(1.0)  # let them all reach the service and block there
        assert not any(p.done() for p in polls)
        started = time.monotonic()
        await lease.renew()
        ticket = await client.lock("crowd", ttl=120).try_acquire("next")
        # Behind the long polls it would wait until they end (10 s).
        assert time.monotonic() - started < 6.0, "a renewal waited behind the long polls"
        assert not ticket.acquired and ticket.position == 0
        await lease.release()  # wakes "next" only: its poll is not among these
        for poll in polls:
            poll.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
    finally:
        await client.close()
