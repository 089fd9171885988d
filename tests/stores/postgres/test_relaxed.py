"""``durability=relaxed``: lock and semaphore commits do not wait for the disk, so a server
crash may forget the last grants. What must still hold (docs/postgres.md, "Durability"):

* a fencing token is never issued twice, not even after grants were forgotten (tokens are
  taken from the server clock, which has moved on by the time the server is back);
* every holder whose grant was forgotten learns it at its next renewal (its lease is lost),
  and every holder whose grant survived keeps it;
* queue operations stay durable;
* with the default, ``durability=durable``, a crash forgets nothing (``test_restart.py``).

To make "the last grants" a known set, the test stops (SIGSTOP) the server's WAL writer
before granting them: an asynchronous commit then stays in the server's memory until the
crash (``pg_ctl stop -m immediate``, which ends the stopped writer with SIGKILL). Grants
made before it, followed by a durable commit, reach the disk."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

import turnstile
from turnstile._sync.backends.postgres import IDLE_STREAK
from turnstile.errors import LeaseLost
from turnstile.stores.postgres import sql as pg

from ._cluster import Cluster
from ._util import schema_url, unique

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TTL = 60.0  # outlives the crash and restart: a lease is judged by the store, not by time


def _wal_writer_pid(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
        ).fetchone()
    assert row is not None, "no WAL writer process"
    return int(row[0])


class _Crashable:
    """A cluster of the test's own whose WAL writer it can stop (SIGSTOP) before crashing the
    server (``pg_ctl stop -m immediate``: SIGQUIT, then SIGKILL for the stopped writer), so
    that the asynchronous commits made in between are certainly lost. The writer is resumed
    and the cluster removed at the end, whatever happened. Its WAL buffers are large (16 MB,
    against 1 MB for these clusters' 32 MB of shared buffers), so that no backend has to
    write WAL out itself to make room while the writer is stopped."""

    def __init__(self, settings: dict[str, str | int]) -> None:
        self.cluster = Cluster({"wal_buffers": "16MB", **settings})
        self._stopped = False

    def __enter__(self) -> _Crashable:
        return self

    def stop_wal_writer(self) -> None:
        os.kill(_wal_writer_pid(self.cluster.url), signal.SIGSTOP)
        self._stopped = True

    def wal_flushed(self) -> tuple[str, ...]:
        """The WAL's insert, write and flush positions (a read-only query), for a failure's
        message: whether something wrote out the WAL with its writer stopped."""
        with psycopg.connect(self.cluster.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_lsn()::text,"
                " pg_current_wal_flush_lsn()::text"
            ).fetchone()
        assert row is not None
        return tuple(row)

    def crash_and_start(self) -> None:
        self.cluster.stop("immediate")
        self._stopped = False
        self.cluster.start()

    def __exit__(self, *exc: object) -> None:
        if self._stopped:
            with contextlib.suppress(Exception):
                os.kill(_wal_writer_pid(self.cluster.url), signal.SIGCONT)
        self.cluster.close()


def _load(
    client: turnstile.Client, seconds: float, tokens: list[int], name: str = "relaxed:load"
) -> None:
    """Three threads taking turns on one name as fast as they can, recording every token."""
    lock = client.lock(name, ttl=TTL)
    stop = time.monotonic() + seconds
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while time.monotonic() < stop:
                with lock.acquire(timeout=30) as lease:
                    tokens.append(lease.token)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(set(tokens)) == len(tokens), "a token was issued twice"


@pytest.mark.parametrize("prepare", ["off", "on"])
def test_a_crash_forgets_only_unflushed_grants_and_their_holders_learn_it(prepare: str) -> None:
    """prepare=on: acquire and release are the plain statements, relaxed by a set_config in
    the statement itself rather than the wrapping query. Autovacuum off, as in the test below:
    a vacuum's commit or buffer write between the WAL writer's stop and the crash would flush
    the grants this test expects forgotten (the dead padding rows of schema version 19 give it
    a table to vacuum)."""
    with _Crashable({"checkpoint_timeout": "1h", "autovacuum": "off"}) as crashable:
        cluster = crashable.cluster
        url = schema_url(
            cluster.url, unique(), retry_timeout="60", durability="relaxed", prepare=prepare
        )
        client = turnstile.connect(url)
        assert client.characteristics.durable is False
        assert "durability=relaxed" in client.characteristics.description
        try:
            tokens_before: list[int] = []
            _load(client, 1.0, tokens_before)
            # Grants that reach the disk: the durable queue put flushes the WAL before it.
            kept = [client.lock(f"relaxed:kept:{i}", ttl=TTL).acquire() for i in range(3)]
            client.queue("relaxed:q").put({"n": 1})

            crashable.stop_wal_writer()
            # Grants that stay in the server's memory until the crash: three made before a
            # moment of load, three right before the crash (the last can only be lost if
            # nothing at all wrote the WAL out after them).
            fresh = [client.lock(f"relaxed:fresh:{i}", ttl=TTL).acquire() for i in range(3)]
            _load(client, 0.5, tokens_before)
            fresh += [client.lock(f"relaxed:fresh:{i}", ttl=TTL).acquire() for i in range(3, 6)]
            flushed = crashable.wal_flushed()

            crashable.crash_and_start()

            # At its next renewal each holder learns whether the store still has its grant.
            survived: dict[str, bool] = {}
            for lease in kept + fresh:
                holders = client.lock(lease.name).status().holders
                survived[lease.name] = [(h.holder, h.token) for h in holders] == [
                    (lease.holder, lease.token)
                ]
                if survived[lease.name]:
                    lease.renew()
                    assert not lease.lost
                    lease.release()
                else:
                    assert holders == ()
                    with pytest.raises(LeaseLost):
                        lease.renew()
                    assert lease.lost
            assert all(survived[lease.name] for lease in kept), survived
            forgotten = [lease.name for lease in fresh if not survived[lease.name]]
            assert forgotten, (
                f"no grant was forgotten, so this test shows nothing: {survived}; WAL before"
                f" the crash (insert, write, flush): {flushed}"
            )

            # Queues stay durable: the message put before the crash is there.
            message = client.queue("relaxed:q").get(timeout=5)
            assert message is not None and message.payload == {"n": 1}
            message.ack()

            # No token repeats: every token issued after the crash is above every one before,
            # forgotten ones included.
            tokens_after: list[int] = []
            # On a name of its own: the crash may have forgotten the last release of
            # relaxed:load, which then stays held by that holder until its ttl runs out.
            _load(client, 0.5, tokens_after, "relaxed:load:after")
            newcomer = client.lock(forgotten[0], ttl=TTL).acquire()
            tokens_after.append(newcomer.token)
            newcomer.release()
            before = tokens_before + [lease.token for lease in kept + fresh]
            assert len(set(before)) == len(before), "a token repeated before the crash"
            assert min(tokens_after) > max(before), "a token was issued twice"
            assert len(set(tokens_after)) == len(tokens_after)
        finally:
            client.close()


@pytest.mark.parametrize("durability", ["durable", "strict"])
def test_a_crash_forgets_at_most_releases_that_granted_nobody(durability: str) -> None:
    """With the default (durable), a release that frees an idle name commits without waiting
    for the disk: a crash may forget it, and the name is then held by the holder that
    released it, with its token and expiry, until that lease runs out: nobody else is
    granted it meanwhile. Everything else is kept: grants, and a release that granted a
    waiter (the waiter holds the name after the crash). durability=strict forgets nothing."""
    with _Crashable({"checkpoint_timeout": "1h", "autovacuum": "off"}) as crashable:
        cluster = crashable.cluster
        url = schema_url(cluster.url, unique(), retry_timeout="60", durability=durability)
        client = turnstile.connect(url)
        assert client.characteristics.durable is True
        description = client.characteristics.description
        assert ("durability=strict" in description) == (durability == "strict")
        try:
            # Waiters of a hand-over, blocked before the WAL writer stops.
            handed: dict[str, Any] = {}
            first = client.lock("release:handed", ttl=TTL).acquire()
            joined = threading.Event()

            def wait_for_it() -> None:
                lock = client.lock("release:handed", ttl=TTL)
                joined.set()
                handed["lease"] = lock.acquire(timeout=60)

            waiter = threading.Thread(target=wait_for_it)
            waiter.start()
            assert joined.wait(10)
            deadline = time.monotonic() + 10
            while len(client.lock("release:handed").status().waiters) < 1:
                assert time.monotonic() < deadline, "the waiter never joined"
                time.sleep(0.01)
            # The first name used over and over first: its last release is release_idle (the
            # bare UPDATE), the others' release_fast (the UPDATE, the function behind it).
            for _ in range(IDLE_STREAK):
                client.lock("release:idle:0", ttl=TTL).acquire().release()
            idle = [client.lock(f"release:idle:{i}", ttl=TTL).acquire() for i in range(3)]
            backend: Any = client.backend
            assert backend._known["release:idle:0"] >= IDLE_STREAK

            crashable.stop_wal_writer()
            first.release()  # grants the waiter: durable, flushes everything before it
            waiter.join(30)
            assert "lease" in handed
            # A hand-over grants for the waiter's short wait_ttl until its holder claims the
            # full ttl: claim it now, or a slow restart would outlast the grant.
            handed["lease"].renew()
            for lease in idle:  # free idle names, granting nobody
                assert lease.release()

            crashable.crash_and_start()

            holders = client.lock("release:handed").status().holders
            assert [(h.holder, h.token) for h in holders] == [
                (handed["lease"].holder, handed["lease"].token)
            ]
            handed["lease"].release()
            forgotten = 0
            for lease in idle:
                status = client.lock(lease.name).status()
                if status.holders:
                    forgotten += 1
                    # Held by the holder that released it, until its lease runs out.
                    [held] = status.holders
                    assert (held.holder, held.token) == (lease.holder, lease.token)
                    assert held.expires_at == pytest.approx(lease.expires_at, abs=0.01)
                    with pytest.raises(turnstile.AcquireTimeout):
                        client.lock(lease.name, ttl=TTL).acquire_nowait()
                else:
                    assert status.waiters == ()
                    client.lock(lease.name, ttl=TTL).acquire_nowait().release()
            if durability == "strict":
                assert forgotten == 0, "durability=strict forgot a release"
            else:
                # The WAL writer was stopped and nothing durable came after the releases.
                assert forgotten == len(idle), f"{forgotten} of {len(idle)} releases forgotten"
        finally:
            client.close()


def test_durability_is_validated_and_only_lock_operations_are_relaxed() -> None:
    with pytest.raises(turnstile.ConfigurationError, match=r"durability='fast' must be .*strict"):
        turnstile.connect("postgresql://u@127.0.0.1:1/db?durability=fast")

    def config(url: str) -> pg.PostgresConfig:
        return pg.parse_url(url, urlsplit(url))

    relaxed = config("postgresql://u@h/db?durability=relaxed")
    assert "durability" not in relaxed.conninfo  # Turnstile's own, never sent to libpq
    for name in pg.RELAXABLE:
        assert "synchronous_commit" in relaxed.query(name)
    assert all("synchronous_commit" not in relaxed.query(n) for n in pg.QUERIES if "queue" in n)
    durable = config("postgresql://u@h/db")
    assert durable.durability == "durable"
    # Only the UPDATE that frees an idle name (granting nobody) skips the wait for the disk.
    unflushed = {n for n in pg.QUERIES if "synchronous_commit" in durable.query(n)}
    assert unflushed == {"relaxed", "release_fast", "release_idle"}
    strict = config("postgresql://u@h/db?durability=strict")
    assert all("synchronous_commit" not in strict.query(n) for n in pg.QUERIES if n != "relaxed")
