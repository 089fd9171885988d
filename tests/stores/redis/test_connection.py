"""Connections dropped in the middle of an operation.

A proxy we control sits between the client and its own redis-server and loses the reply of
one chosen request (the server has run it; the client sees its connection close), or the
server kills the client's connection (CLIENT KILL). Every script is idempotent, so the
client's retry gets the same answer: no grant is lost or given twice, and a retried release
of an old token never touches a newer holder.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import turnstile
import turnstile.aio

from ._tools import CuttingProxy, RedisProcess, redis_process, wait_until

pytestmark = pytest.mark.redis

PREFIX = "?prefix=tt-conn:"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    with redis_process(tmp_path / "redis", "--appendonly", "no") as srv:
        yield srv


@pytest.fixture
def proxy(server: RedisProcess) -> Iterator[CuttingProxy]:
    p = CuttingProxy(server.port)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def direct(server: RedisProcess) -> Iterator[turnstile.Client]:
    c = turnstile.connect(server.url + PREFIX)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def cut(proxy: CuttingProxy) -> Iterator[turnstile.Client]:
    """A client whose connection goes through the proxy."""
    c = turnstile.connect(proxy.url + PREFIX)
    try:
        yield c
    finally:
        c.close()


def test_reply_lost_on_a_fresh_grant(
    cut: turnstile.Client, direct: turnstile.Client, proxy: CuttingProxy
) -> None:
    proxy.cut_reply_after(b"holder-A")
    ticket = cut.lock("job", ttl=30).try_acquire(holder="holder-A")
    assert proxy.cuts == 1  # the first reply was really lost; the retry answered
    assert ticket.acquired and ticket.lease is not None
    status = direct.lock("job").status()
    assert [(h.holder, h.token) for h in status.holders] == [("holder-A", ticket.lease.token)]
    assert status.waiters == ()


def test_reply_lost_when_joining_and_when_claiming_a_handover(
    cut: turnstile.Client, direct: turnstile.Client, proxy: CuttingProxy
) -> None:
    first = direct.lock("job", ttl=30).try_acquire(holder="first")
    assert first.lease is not None
    lock = cut.lock("job", ttl=30)

    proxy.cut_reply_after(b"holder-B")
    assert lock.try_acquire(holder="holder-B").position == 0  # joined exactly once
    assert proxy.cuts == 1
    assert [w.holder for w in direct.lock("job").status().waiters] == ["holder-B"]

    assert first.lease.release()  # hands the lock to holder-B (unclaimed)
    handed = direct.lock("job").status().holders
    assert [h.holder for h in handed] == ["holder-B"]

    proxy.cut_reply_after(b"holder-B")
    claimed = lock.try_acquire(holder="holder-B")  # claim: reply lost, retried
    assert proxy.cuts == 2
    assert claimed.acquired and claimed.lease is not None
    assert claimed.lease.token == handed[0].token  # the same grant, not a second one
    status = direct.lock("job").status()
    assert [(h.holder, h.token) for h in status.holders] == [("holder-B", claimed.lease.token)]
    assert status.holders[0].expires_at - status.now > 25  # claimed for its full ttl


def test_reply_lost_on_release_hands_over_once(
    cut: turnstile.Client, direct: turnstile.Client, proxy: CuttingProxy
) -> None:
    lease = cut.lock("job", ttl=30).acquire(timeout=1, holder="holder-A")
    lock = direct.lock("job", ttl=30)
    assert lock.try_acquire(holder="next").position == 0
    assert lock.try_acquire(holder="after").position == 1

    proxy.cut_reply_after(b"holder-A")
    lease.release()  # ran on the server, reply lost, retried: harmless
    assert proxy.cuts == 1

    status = lock.status()
    assert [h.holder for h in status.holders] == ["next"]  # handed over exactly once
    assert [w.holder for w in status.waiters] == ["after"]
    newer = status.holders[0].token
    assert newer > lease.token

    # A late replay of the old release never touches the newer holder.
    assert cut.lock("job").release("holder-A", lease.token) is False
    assert [(h.holder, h.token) for h in lock.status().holders] == [("next", newer)]


def test_retried_release_of_an_old_token_spares_the_same_holders_new_lease(
    cut: turnstile.Client, direct: turnstile.Client, proxy: CuttingProxy
) -> None:
    lock = cut.lock("job", ttl=30)
    old = lock.acquire(timeout=1, holder="worker")
    proxy.cut_reply_after(b"worker")
    old.release()
    assert proxy.cuts == 1
    new = lock.acquire(timeout=1, holder="worker")  # the same holder id, a new grant
    assert new.token > old.token
    assert lock.release("worker", old.token) is False
    assert [(h.holder, h.token) for h in direct.lock("job").status().holders] == [
        ("worker", new.token)
    ]
    with pytest.raises(turnstile.LeaseLost):
        old.renew()
    assert new.release()


def test_unreachable_proxy_raises_backend_unavailable_with_cause(
    cut: turnstile.Client, proxy: CuttingProxy
) -> None:
    lock = cut.lock("job", ttl=30)
    assert lock.acquire(timeout=1).release()
    proxy.refuse = True
    proxy.cut_reply_after(b"tt-conn:")  # a step (keys under the prefix): also drop the pooled
    # connection on its next use
    with pytest.raises(turnstile.BackendUnavailable) as info:
        lock.acquire(timeout=1)
    assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)
    assert f"127.0.0.1:{proxy.port}" in str(info.value)


def test_killed_subscriber_connection_still_gets_the_handover(
    server: RedisProcess, direct: turnstile.Client
) -> None:
    """The waiting client's subscriber connection is killed: it reconnects, and the next
    hand-over wakes the waiter on it at once."""
    lock = direct.lock("job", ttl=30)
    holder = lock.acquire(timeout=1)
    waiter_client = turnstile.connect(server.url + PREFIX)
    got: dict[str, object] = {}

    def wait() -> None:
        lease = waiter_client.lock("job", ttl=30).acquire(timeout=20)
        got["at"] = time.monotonic()
        got["token"] = lease.token
        lease.release()

    thread = threading.Thread(target=wait)
    thread.start()
    admin = server.admin()
    try:

        def subscriber_ids() -> list[int]:
            return [
                int(c["id"]) for c in admin.client_list() if int(c.get("sub", 0) or 0) > 0
            ]

        def in_line() -> bool:
            return len(lock.status().waiters) == 1

        assert wait_until(lambda: bool(subscriber_ids()) and in_line(), 10)
        listener = waiter_client.backend.connection.listener  # type: ignore[attr-defined]
        connects = listener.connects
        for cid in subscriber_ids():
            admin.client_kill_filter(_id=cid)
        # The subscriber connection comes back (the waiter looks again meanwhile, and once
        # it is back: a hand-over announced in between would otherwise go unheard).
        assert wait_until(lambda: listener.connects > connects and listener.up, 10)
        time.sleep(0.1)
        released_at = time.monotonic()
        assert holder.release()
        thread.join(20)
        assert not thread.is_alive()
        assert int(got["token"]) > holder.token  # type: ignore[call-overload]
        # Woken by the handover (on the subscriber connection made again), not by a
        # heartbeat.
        assert float(got["at"]) - released_at < 1.0  # type: ignore[arg-type]
    finally:
        admin.close()
        waiter_client.close()


def test_killed_script_connections_are_retried(
    server: RedisProcess, direct: turnstile.Client
) -> None:
    lock = direct.lock("job", ttl=30)
    tokens = []
    admin = server.admin()
    try:
        for _ in range(5):
            me = admin.client_id()
            for c in admin.client_list():
                if int(c["id"]) != me:
                    admin.client_kill_filter(_id=int(c["id"]))
            lease = lock.acquire(timeout=2)
            tokens.append(lease.token)
            assert lease.release()
    finally:
        admin.close()
    assert tokens == sorted(tokens) and len(set(tokens)) == 5
    assert lock.status().holders == ()


def test_scripts_run_on_connections_kept_aside(direct: turnstile.Client) -> None:
    """One caller's scripts reuse one connection kept aside, past the pool (see
    ``_direct_pool``); callers in many threads each get one, and leave none checked out
    wrongly: every connection is back in step for the next script."""
    connection = direct.backend.connection  # type: ignore[attr-defined]
    assert connection._direct is connection.client.connection_pool
    lock = direct.lock("aside", ttl=30)
    for _ in range(20):
        with lock.acquire(timeout=2):
            pass
    assert len(connection._spare) == 1
    sem = direct.semaphore("aside-threads", limit=3, ttl=30)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(20):
                with sem.acquire(timeout=10):
                    pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert 1 <= len(connection._spare) <= 5
    assert sem.status().holders == ()
    for _ in range(10):  # each kept-aside connection answers the next script in step
        with lock.acquire(timeout=2):
            pass


def test_a_refused_lead_ping_leaves_the_connection_in_step(server: RedisProcess) -> None:
    """A release sends a PING ahead of its script on the same connection (see
    ``RedisConnection._call``). A user whose ACL refuses PING gets an error reply to it: the
    script's reply is read all the same, so the release works, and every later step on that
    connection reads its own reply (no reply left behind for the next caller)."""
    with server.admin() as admin:
        admin.execute_command(
            "ACL", "SETUSER", "noping", "on", ">secret-pw", "~*", "&*", "+@all", "-ping"
        )
    url = f"redis://noping:secret-pw@127.0.0.1:{server.port}/0" + PREFIX
    client = turnstile.connect(url)
    try:
        lock = client.lock("no-ping", ttl=30)
        tokens = []
        for _ in range(5):
            lease = lock.acquire(timeout=2)
            tokens.append(lease.token)
            assert lease.release() is True
        assert tokens == sorted(tokens) and len(set(tokens)) == 5
        held = lock.acquire(timeout=2)
        handed: list[turnstile.Lease] = []
        thread = threading.Thread(target=lambda: handed.append(lock.acquire(timeout=10)))
        thread.start()
        assert wait_until(lambda: len(lock.status().waiters) == 1, 10)
        assert held.release() is True
        thread.join(10)
        assert handed and handed[0].token > held.token
        assert handed[0].release() is True
        assert lock.status().holders == ()
        with server.admin() as admin:
            stats = admin.info("errorstats")
        assert any("NOPERM" in k for k in stats), stats  # the PINGs were refused
    finally:
        client.close()


def test_threads_that_ask_at_once_share_one_listener(server: RedisProcess) -> None:
    """The first waiters of a client, in threads that start together, make one listener
    between them (a second one would open a second subscriber connection that closing the
    client leaves open)."""
    client = turnstile.connect(server.url + PREFIX)
    try:
        connection: Any = client.backend.connection  # type: ignore[attr-defined]
        for _ in range(20):
            connection._listeners.clear()
            barrier = threading.Barrier(8)
            got: list[object] = []

            def ask(barrier: threading.Barrier, got: list[object]) -> None:
                barrier.wait()
                got.append(connection.listener)

            threads = [threading.Thread(target=ask, args=(barrier, got)) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            assert len(got) == 8 and all(x is got[0] for x in got)
            assert connection.listener is got[0]
    finally:
        client.close()


def test_many_waiters_of_one_client_share_one_subscriber_connection(
    server: RedisProcess, direct: turnstile.Client
) -> None:
    """16 threads of one client wait on one name: the server sees one subscriber connection
    of that client and none of its connections blocked in a command, and the hand-overs go
    down the line in order, each to the next waiter, woken by its wake-up (read by whichever
    waiter has the turn, and the turn passed on as each one leaves) rather than by its next
    heartbeat step: 16 hand-overs left to heartbeats (every 5/3 s) would take about 27 s."""
    waiters = 16
    holder = direct.lock("many", ttl=30).acquire(timeout=1)
    client = turnstile.connect(server.url + PREFIX + "&client_name=tt-many")
    granted: list[tuple[str, int]] = []
    errors: list[BaseException] = []
    done = threading.Lock()

    def wait(i: int) -> None:
        try:
            lease = client.lock("many", ttl=30).acquire(timeout=60, holder=f"w{i}")
            with done:
                granted.append((f"w{i}", lease.token))
            lease.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(waiters)]
    try:
        for t in threads:
            t.start()
        lock = direct.lock("many")
        assert wait_until(lambda: len(lock.status().waiters) == waiters, 30)
        line = [w.holder for w in lock.status().waiters]
        with server.admin() as admin:
            mine = [c for c in admin.client_list() if c.get("name") == "tt-many"]
        assert len([c for c in mine if int(c.get("sub", 0) or 0) > 0]) == 1, mine
        assert not [c for c in mine if c.get("cmd", "").startswith(("bl", "br", "bz")) and
                    int(c.get("sub", 0) or 0) == 0], mine
        released = time.monotonic()
        assert holder.release()
        for t in threads:
            t.join(60)
        took = time.monotonic() - released
        assert not errors, errors
        assert took < 10, took
        assert [h for h, _ in granted] == line  # first come, first served
        tokens = [t for _, t in granted]
        assert tokens == sorted(tokens) and tokens[0] > holder.token
    finally:
        client.close()


async def test_many_async_waiters_share_one_subscriber_connection(server: RedisProcess) -> None:
    """The async flavour: 16 tasks of one client wait on one name, woken in line order on
    the client's one subscriber connection."""
    waiters = 16
    client = await turnstile.aio.connect(server.url + PREFIX + "&client_name=tt-many-aio")
    try:
        lock = client.lock("many-aio", ttl=30)
        holder = await lock.acquire(timeout=1)
        granted: list[tuple[str, int]] = []

        async def wait(i: int) -> None:
            lease = await client.lock("many-aio", ttl=30).acquire(timeout=60, holder=f"w{i}")
            granted.append((f"w{i}", lease.token))
            await lease.release()

        tasks = [asyncio.ensure_future(wait(i)) for i in range(waiters)]
        deadline = time.monotonic() + 30
        while len((await lock.status()).waiters) < waiters:
            assert time.monotonic() < deadline, "the waiters never all got in line"
            await asyncio.sleep(0.01)
        line = [w.holder for w in (await lock.status()).waiters]
        with server.admin() as admin:
            mine = [c for c in admin.client_list() if c.get("name") == "tt-many-aio"]
        assert len([c for c in mine if int(c.get("sub", 0) or 0) > 0]) == 1, mine
        released = time.monotonic()
        assert await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert time.monotonic() - released < 10
        assert [h for h, _ in granted] == line
        tokens = [t for _, t in granted]
        assert tokens == sorted(tokens) and tokens[0] > holder.token
    finally:
        await client.close()
