"""A hand-over's NOTIFY carries the grant, on the waiting client's own channel (schema version
3): the waiter holds the lease on receipt, without another acquire step; a grant lasting only
``wait_ttl`` is claimed for the full ``ttl`` in the background; nobody else hears it; a grant
made for an earlier wait is never taken for a later one; and a schema migrated from version 2
still wakes the waiters that joined through the old function."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

import turnstile
from turnstile._sync.backends.postgres_listen import PostgresWaiter
from turnstile.stores.postgres import sql as pg

from ._util import wait_for

pytestmark = pytest.mark.postgres


def _blocked(lock: Any, out: dict[str, Any], renew: bool) -> threading.Thread:
    def run() -> None:
        try:
            lease = lock.acquire(timeout=20)
            out["statements"] = lock._backend.statements
            out["lease"] = lease
            if renew:
                with lease:
                    out["entered"] = True
                    wait_for(lambda: out.get("leave"), "the test never let the block end")
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("renew", [True, False], ids=["with-block", "bare"])
def test_the_wakeup_hands_over_the_grant(pg_url: str, renew: bool) -> None:
    holder = turnstile.connect(pg_url)
    waiter = turnstile.connect(pg_url)
    bystander = turnstile.connect(pg_url)
    name = "handed"
    try:
        # A bystander client that also waits (on another name) has a LISTEN connection too.
        bystander_lease = bystander.lock("other", ttl=30).acquire()
        first = holder.lock(name, ttl=30).acquire()
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as ears:
            ears.execute(f"LISTEN {pg.quote_ident(holder.backend.config.channel)}")  # type: ignore[attr-defined]
            listener = bystander.backend.listener  # type: ignore[attr-defined]
            listener.connect(10.0)
            wait_for(lambda: listener.up, "the bystander's LISTEN connection")
            ears.execute(f"LISTEN {pg.quote_ident(listener.channel)}")

            # The waiter's client has waited before: its LISTEN connection is up. (A client's
            # very first wait steps once more: the step that put it in line was made before
            # it listened, so a hand-over in between may have gone unheard.)
            ears_of_waiter = waiter.backend.listener  # type: ignore[attr-defined]
            ears_of_waiter.connect(10.0)
            wait_for(lambda: ears_of_waiter.up, "the waiter's LISTEN connection")

            out: dict[str, Any] = {}
            lock = waiter.lock(name, ttl=30)
            thread = _blocked(lock, out, renew)
            wait_for(lambda: holder.lock(name).status().waiters, "the waiter never got in line")
            in_line = waiter.backend.statements  # type: ignore[attr-defined]
            assert first.release()
            wait_for(lambda: "lease" in out or "error" in out, "the waiter was not woken")
            assert "error" not in out, out.get("error")
            lease = out["lease"]
            # Woken with the grant: no acquire step after the wake-up.
            assert out["statements"] == in_line
            status = holder.lock(name).status()
            assert [(h.holder, h.token) for h in status.holders] == [(lease.holder, lease.token)]
            assert lease.token > first.token
            # Unclaimed: it lasts the waiter's wait_ttl (5 s), not the whole ttl, until claimed.
            assert lease.expires_at - lease.acquired_at == pytest.approx(5.0, abs=0.01)
            assert 0 < lease.remaining <= 5.0
            # Nobody else heard the hand-over: not the schema's channel, not another client's.
            assert list(ears.notifies(timeout=0.3)) == []

        # A third of the way into the short grant the renewer claims it for the full ttl,
        # with or without a with-block.
        wait_for(
            lambda: holder.lock(name).status().holders[0].expires_at - lease.acquired_at > 20,
            "the grant was never claimed for its ttl",
        )
        # The lease learns of it when the renewal's answer arrives, a moment after the store
        # committed it (which another connection may see first).
        wait_for(lambda: lease.remaining > 25, "the lease never learnt of its claim")
        assert not lease.lost
        assert lease.expires_at - time.time() > 25 - 1  # the store's clock is this host's
        if renew:
            assert out.get("entered")
        out["leave"] = True
        thread.join(10)
        if not renew:
            assert lease.release()
        assert holder.lock(name).status().holders == ()
        bystander_lease.release()
    finally:
        for c in (holder, waiter, bystander):
            c.close()


def test_a_grant_for_an_earlier_wait_is_not_taken() -> None:
    """The wake-up names the waiting entry (its seq); a late one from an earlier wait of the
    same (name, holder) must not make a later wait believe it holds."""
    w = PostgresWaiter(None, "key", "n", "h")
    w.deliver("41 7 1700000000.5 1700000005.5")
    assert w.handed(42) is None
    w.deliver("42 8 1700000001.25 1700000006.25")
    grant = w.handed(42)
    assert grant is not None
    assert (grant.name, grant.holder, grant.token) == ("n", "h", 8)
    assert (grant.acquired_at, grant.expires_at) == (1700000001.25, 1700000006.25)
    assert w.handed(42) is None  # taken once
    w.deliver("not a grant")  # malformed: ignored (logged), still a wake-up
    assert w.handed(0) is None
    w.close()


def test_waiters_of_a_version_2_schema_are_still_woken(pg_url: str) -> None:
    """A client of the previous release (acquire with 7 arguments, no channel) that is in line
    while the schema migrates to version 3 is woken as before: the bare wake key on the
    schema's channel."""
    from urllib.parse import urlsplit

    config = pg.parse_url(pg_url, urlsplit(pg_url))
    server = config.conninfo
    with psycopg.connect(server, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(config.query("create_schema"))
            conn.execute(config.query("create_version_table"))
            for number, filename, script in pg.MIGRATIONS[:2]:
                conn.execute(pg.render(script, config.schema))
                conn.execute(config.query("record_version"), {"version": number, "name": filename})
        old_acquire = (
            f"SELECT granted, token FROM {pg.quote_ident(config.schema)}.acquire("
            "%s::text, %s::text, 1, 30::float8, 5::float8, true, NULL::timestamptz)"
        )
        granted, token = conn.execute(old_acquire, ("legacy", "old-holder")).fetchone()  # type: ignore[misc]
        assert granted
        granted, _ = conn.execute(old_acquire, ("legacy", "old-waiter")).fetchone()  # type: ignore[misc]
        assert not granted
        conn.execute(f"LISTEN {pg.quote_ident(config.channel)}")
        client = turnstile.connect(pg_url)  # migrates the schema to the current version
        try:
            version = conn.execute(
                f"SELECT max(version) FROM {pg.quote_ident(config.schema)}.schema_version"
            ).fetchone()
            assert version == (pg.SCHEMA_VERSION,)
            # The old 7-argument function still works after the migration, and its waiters
            # are woken the old way too.
            granted, _ = conn.execute(old_acquire, ("legacy", "late-waiter")).fetchone()  # type: ignore[misc]
            assert not granted
            assert client.lock("legacy").release(holder="old-holder", token=token)
            heard = [n.payload for n in conn.notifies(timeout=2.0, stop_after=1)]
            assert heard == [pg.wake_key("legacy", "old-waiter")]
            assert [h.holder for h in client.lock("legacy").status().holders] == ["old-waiter"]
            assert client.lock("legacy").release(holder="old-waiter")
            heard = [n.payload for n in conn.notifies(timeout=2.0, stop_after=1)]
            assert heard == [pg.wake_key("legacy", "late-waiter")]
            assert [h.holder for h in client.lock("legacy").status().holders] == ["late-waiter"]
        finally:
            client.close()
