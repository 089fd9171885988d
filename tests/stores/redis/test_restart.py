"""A Redis server restarts (kill -9, then start again on the same folder and port).

With ``appendonly yes`` + ``appendfsync always`` every script's effects are on disk before
its reply, so holders, waiters (in order) and the token counter all survive (with
``everysec`` they are in the OS's hands before the reply: a killed server loses nothing, an
OS crash up to about a second). Without
persistence everything about a name is lost (docs/redis.md, "Persistence"): holders,
waiters and the counter; tokens still never repeat because they are at least the server's
clock in microseconds, and a holder still running learns that it lost its lease.

A waiter blocked in ``acquire`` while the server is killed and started again keeps its
place and gets the grant within a second of the server being back (issue 17). The other
stores: PostgreSQL's restarts are in ``tests/stores/postgres/test_restart.py``; SQLite has no
server to restart (a killed holder process is its fault, ``tests/contract/test_crash.py``);
the HTTP service's restart is tested with the service (``tests/server/``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import turnstile
from turnstile import LeaseLost
from turnstile._sync.backends.redis_connection import RIDE_OUT

from ._tools import RedisProcess, redis_process

pytestmark = pytest.mark.redis

PREFIX = "?prefix=tt-restart:"


def _line(status: turnstile.Status) -> list[tuple[str, int]]:
    return [(w.holder, w.position) for w in status.waiters]


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_restart_with_append_only_file_keeps_holders_waiters_and_tokens(
    tmp_path: Path, fsync: str
) -> None:
    # kill -9 of the server: "always" has fsynced every script's effects before its reply;
    # "everysec" has written them to the OS (lost only if the OS itself crashes).
    with redis_process(tmp_path / "aof", "--appendonly", "yes", "--appendfsync", fsync) as srv:
        client = turnstile.connect(srv.url + PREFIX)
        try:
            lock = client.lock("order:{42}", ttl=30)
            first = lock.try_acquire(holder="holder")
            assert first.acquired and first.lease is not None
            for i, name in enumerate(["w1", "w2", "w3"]):
                assert lock.try_acquire(holder=name).position == i
            sem = client.semaphore("pool", 2, ttl=30)
            assert sem.try_acquire(holder="a").acquired
            assert sem.try_acquire(holder="b").acquired
            assert sem.try_acquire(holder="c").position == 0
            before = (lock.status(), sem.status())

            srv.kill()
            srv.start()

            after = (lock.status(), sem.status())
            for old, new in zip(before, after, strict=True):
                assert new.holders == old.holders  # same holders, tokens and expiry times
                assert new.waiters == old.waiters  # same line, same order
                assert new.limit == old.limit
            assert _line(after[0]) == [("w1", 0), ("w2", 1), ("w3", 2)]

            # The line goes on where it stopped, with larger tokens.
            assert lock.release("holder", first.lease.token)
            granted = lock.try_acquire(holder="w1")
            assert granted.acquired and granted.lease is not None
            assert granted.lease.token > first.lease.token
            assert _line(lock.status()) == [("w2", 0), ("w3", 1)]
            assert client.names() == ["order:{42}", "pool"]
        finally:
            client.close()


def test_restart_without_persistence_loses_holders_and_waiters(tmp_path: Path) -> None:
    with redis_process(tmp_path / "volatile", "--appendonly", "no") as srv:
        client = turnstile.connect(srv.url + PREFIX)
        try:
            lock = client.lock("job", ttl=30)
            old = lock.try_acquire(holder="holder")
            assert old.lease is not None
            assert lock.try_acquire(holder="waiter").position == 0

            srv.kill()
            srv.start()

            # What is lost: the holder's lease, the line, the limit (nothing is left) ...
            status = lock.status()
            assert status.holders == () and status.waiters == ()
            assert client.names() == []
            # ... so a newcomer is granted at once, while the old holder may still run.
            new = lock.try_acquire(holder="newcomer")
            assert new.acquired and new.lease is not None
            # What is not lost: tokens still increase.
            assert new.lease.token > old.lease.token
            # The old holder's renew and release are refused: it cannot touch the new grant.
            with pytest.raises(LeaseLost):
                old.lease.renew()
            assert lock.release("holder", old.lease.token) is False
            assert [h.holder for h in lock.status().holders] == ["newcomer"]
        finally:
            client.close()


def test_tokens_never_repeat_across_restarts_without_persistence(tmp_path: Path) -> None:
    with redis_process(tmp_path / "volatile", "--appendonly", "no") as srv:
        highest = 0
        for _cycle in range(3):
            client = turnstile.connect(srv.url + PREFIX)
            try:
                tokens = _burst_of_tokens(client)
            finally:
                client.close()
            assert min(tokens) > highest, "a token repeated after a restart"
            assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
            highest = max(tokens)
            srv.kill()
            srv.start()


def _burst_of_tokens(client: turnstile.Client) -> list[int]:
    """Many grants inside one script run share one server time, so their tokens run ahead of
    the clock (last + 1): the hardest case for a forgotten counter."""
    small = client.semaphore("burst", 1, ttl=30)
    first = small.try_acquire(holder="h0")
    assert first.lease is not None
    for i in range(1, 40):
        assert small.try_acquire(holder=f"h{i}").position == i - 1
    assert small.set_limit(40) == 1  # raising the limit promotes all 39 waiters in one step
    status = small.status()
    assert len(status.holders) == 40
    return [h.token for h in status.holders]


def test_holder_learns_it_lost_when_redis_restarts_empty(tmp_path: Path) -> None:
    with redis_process(tmp_path / "volatile", "--appendonly", "no") as srv:
        url = srv.url + PREFIX
        client = turnstile.connect(url)
        other = turnstile.connect(url)
        try:
            lock = client.lock("report", ttl=0.9)
            outcome: dict[str, object] = {}
            restarted = threading.Event()

            def holder() -> None:
                try:
                    with lock.acquire(timeout=5) as lease:
                        outcome["token"] = lease.token
                        outcome["ready"] = True
                        restarted.wait(10)
                        time.sleep(1.2)  # renewals (every 0.3 s) meet the empty server
                        outcome["lost_inside"] = lease.lost
                except LeaseLost as exc:
                    outcome["raised"] = exc

            thread = threading.Thread(target=holder)
            thread.start()
            deadline = time.monotonic() + 10
            while "ready" not in outcome and time.monotonic() < deadline:
                time.sleep(0.01)
            srv.kill()
            srv.start()
            restarted.set()
            newcomer = other.lock("report", ttl=5).acquire(timeout=5)
            thread.join(15)
            assert not thread.is_alive()
            assert outcome["lost_inside"] is True
            assert isinstance(outcome.get("raised"), LeaseLost)
            assert newcomer.token > int(outcome["token"])  # type: ignore[call-overload]
            newcomer.release()
        finally:
            client.close()
            other.close()


def test_server_stays_down_then_errors_are_translated(tmp_path: Path) -> None:
    srv = RedisProcess(tmp_path / "down", "--appendonly", "no")
    srv.start()
    client = turnstile.connect(srv.url + PREFIX)
    try:
        lock = client.lock("x", ttl=5)
        assert lock.acquire(timeout=1).release()
        srv.kill()
        started = time.monotonic()
        with pytest.raises(turnstile.BackendUnavailable) as info:
            lock.acquire(timeout=1)
        # Refused connections are retried for RIDE_OUT (a restart would be ridden out), then
        # the error comes, promptly.
        assert RIDE_OUT <= time.monotonic() - started < RIDE_OUT + 5
        import redis

        assert isinstance(info.value.__cause__, redis.exceptions.RedisError)
        assert f"127.0.0.1:{srv.port}" in str(info.value)
    finally:
        client.close()
        srv.kill()


def _waiter_resumes(srv: RedisProcess, name: str, down: float) -> float:
    """One holder, one waiter blocked in ``acquire(timeout=10)`` (each a client of its own),
    the server killed (-9) for ``down`` seconds and started again on its append-only file;
    the holder releases as soon as it can. Returns how long after ``max(server answering,
    release done)`` the waiter got its lease (a token above the holder's)."""
    holder_client = turnstile.connect(srv.url + PREFIX)
    waiter_client = turnstile.connect(srv.url + PREFIX)
    got: dict[str, object] = {}
    try:
        lease = holder_client.lock(name, ttl=30).acquire(timeout=5)

        def blocked() -> None:
            try:
                second = waiter_client.lock(name, ttl=30).acquire(timeout=10)
                got["at"] = time.monotonic()
                got["token"] = second.token
                second.release()
            except BaseException as exc:
                got["error"] = exc

        thread = threading.Thread(target=blocked)
        thread.start()
        deadline = time.monotonic() + 20
        while not holder_client.lock(name).status().waiters:
            assert time.monotonic() < deadline, "the blocked acquire never joined the line"
            time.sleep(0.01)
        # A restart that ends within RIDE_OUT (5 s) costs the waiter nothing, whether it is in
        # BLPOP or in a step; a longer outage ends its acquire with BackendUnavailable.
        srv.kill()
        time.sleep(down)
        srv.start()  # returns once the server answers PING (looked for every 20 ms)
        up = time.monotonic()
        assert lease.release()
        released = time.monotonic()
        thread.join(30)
        assert "error" not in got, repr(got.get("error"))
        assert int(got["token"]) > lease.token  # type: ignore[call-overload]
        return float(got["at"]) - max(up, released)  # type: ignore[arg-type]
    finally:
        holder_client.close()
        waiter_client.close()


@pytest.mark.slow
def test_blocked_waiter_resumes_right_after_a_restart(tmp_path: Path) -> None:
    """Issue 17.10: a waiter blocked in BLPOP while the server is killed and restarted keeps
    its place and gets the grant within 1 s of the server being back (or of the release)."""
    with redis_process(tmp_path / "aof", "--appendonly", "yes", "--appendfsync", "always") as srv:
        late = _waiter_resumes(srv, "blocked", 0.5)
        assert late < 1.0, f"the waiter got its grant {late:.2f} s after the server was back"


@pytest.mark.slow
def test_blocked_waiter_resumes_after_each_of_20_restarts(tmp_path: Path) -> None:
    """The same twenty times in a row, with a shorter outage (a bounded loop)."""
    with redis_process(tmp_path / "aof", "--appendonly", "yes", "--appendfsync", "always") as srv:
        started = time.monotonic()
        lates = [_waiter_resumes(srv, f"blocked{i}", 0.3) for i in range(20)]
        assert max(lates) < 1.0, [round(x, 2) for x in lates]
        assert time.monotonic() - started < 90

