"""The fast paths of the lock scripts (``lua/lock/_fast_acquire.lua``, ``_fast_release.lua``):
an acquire on an idle name and the release of a name's only holder with nobody in line are
answered before the library is built, in a handful of commands, and only while the name's
``=fast`` record, stamped with its token counter and arrival stamp, proves the case — also
against holders and waiters written by a client that knows nothing of it (an earlier
release of Turnstile, emulated here by writing its records directly)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import turnstile
from turnstile._core import ranking
from turnstile.stores.redis import keys as redis_keys

from ._tools import RedisProcess, redis_process, wait_until

pytestmark = pytest.mark.redis


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    with redis_process(tmp_path / "redis", "--appendonly", "no") as srv:
        yield srv


@pytest.fixture
def client(server: RedisProcess) -> Iterator[turnstile.Client]:
    client = turnstile.connect(server.url + "?prefix=tt-fast:")
    try:
        yield client
    finally:
        client.close()


def _keys(client: turnstile.Client, name: str) -> list[str]:
    base = client.backend._keys.get(name)[0]  # type: ignore[attr-defined]
    return redis_keys.name_keys(base)


def _server_us(server: RedisProcess) -> int:
    with server.admin() as admin:
        seconds, micros = admin.time()
    return int(seconds) * 1_000_000 + int(micros)


def _calls(server: RedisProcess) -> dict[str, int]:
    stats = server.commandstats()
    return {k: n for k, n in stats.items() if k not in ("info", "hello", "time")}


def _spent(server: RedisProcess, action: Callable[[], object]) -> dict[str, int]:
    """The commands the server ran during ``action`` (those inside scripts included)."""
    before = _calls(server)
    action()
    after = _calls(server)
    spent = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return {k: n for k, n in spent.items() if n}


def test_an_idle_name_costs_two_short_scripts_per_acquire_and_release(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("idle", ttl=30)
    for _ in range(2):  # the first release learns the name idle; scripts get loaded
        lock.acquire(timeout=1).release()
    leases: list[turnstile.Lease] = []

    def cycles() -> None:
        for _ in range(10):
            leases.append(lock.acquire(timeout=1))
            assert leases[-1].release() is True

    spent = _spent(server, cycles)
    # Per cycle: acquire = HMGET, TIME, HSET, ZADD, PEXPIREAT (the holder index was empty,
    # so it is made again); release = HMGET, TIME, HDEL, ZREM, HSET, and the PING sent ahead
    # of every release (see RedisConnection._call: a woken waiter is written first).
    assert spent == {
        "ping": 10,
        "script": 20,
        "hmget": 20,
        "hset": 20,
        "zadd": 10,
        "pexpireat": 10,
        "hdel": 10,
        "zrem": 10,
    }, spent
    # Tokens still grow, and the name is left with nothing but its counter.
    assert lock.acquire(timeout=1).token > leases[-1].token


def test_a_new_names_first_acquire_gives_an_expiry_only_to_the_keys_it_makes(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """A new name's first acquire takes the fast path (a name with no record is idle): it
    gives its keys' expiry ("=exp") to the record and the holder index it makes, and none to
    the line and the waiters' expiry index, which stay absent. Its release takes the fast
    path too, and the name then behaves as any idle name."""
    client.lock("warm", ttl=30).acquire(timeout=1).release()  # scripts loaded
    lock = client.lock("brand-new", ttl=30)
    leases: list[turnstile.Lease] = []
    spent = _spent(server, lambda: leases.append(lock.acquire(timeout=1)))
    assert spent == {"script": 1, "hmget": 1, "zadd": 1, "hset": 1, "pexpireat": 2}, spent
    d, hx, wx, wq = _keys(client, "brand-new")[:4]
    with server.admin() as admin:
        assert admin.pttl(d) > 0 and admin.pttl(hx) > 0
        assert not admin.exists(wx) and not admin.exists(wq)
        assert admin.hget(d, "=name") == b"brand-new"
        assert admin.hget(d, "=limit") == b"1"
    status = lock.status()
    assert [(h.holder, h.token) for h in status.holders] == [(leases[0].holder, leases[0].token)]
    spent = _spent(server, lambda: leases[0].release())
    assert spent == {"ping": 1, "script": 1, "hmget": 1, "hdel": 1, "zrem": 1, "hset": 1}, spent
    again = lock.acquire(timeout=1)
    assert again.token > leases[0].token
    assert again.release() is True


def test_a_new_name_with_a_callback_or_a_group_takes_the_library(
    client: turnstile.Client, server: RedisProcess
) -> None:
    # The fast path grants plain leases only: a semaphore group's first acquire records its
    # per-key limit, which the library writes.
    client.lock("warm", ttl=30).acquire(timeout=1).release()
    group = client.semaphore_group("new-group", per_key=1, total=2, ttl=30)
    spent = _spent(server, lambda: group.acquire("k", timeout=1))
    assert spent.get("zrange", 0) >= 1, spent  # the library's purge read the indexes
    d = _keys(client, "new-group")[0]
    with server.admin() as admin:
        assert admin.hget(d, "=pk") == b"1" and admin.hget(d, "=limit") == b"2"


def test_a_holder_written_by_a_client_without_fast_paths_is_seen(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("mixed", ttl=30)
    lock.acquire(timeout=1, holder="a").release()  # "=fast" now says: idle
    d, hx = _keys(client, "mixed")[:2]
    now = _server_us(server)
    with server.admin() as admin:
        last = int(admin.hget(d, "=last"))
        token = max(last + 1, now)
        # What an acquire of an earlier release writes: the record, the token counter and
        # the holder index; "=fast" is left as it was.
        admin.hset(d, mapping={"h:old": f"{token} {now} {now + 30_000_000} 1", "=last": token})
        admin.zadd(hx, {"old": now + 30_000_000})
    got = lock.try_acquire(holder="b")
    assert not got.acquired
    assert [h.holder for h in lock.status().holders] == ["old"]


def test_a_waiter_written_by_a_client_without_fast_paths_is_handed_the_lock(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("mixed", ttl=30)
    lock.acquire(timeout=1, holder="a").release()
    lease = lock.acquire(timeout=1, holder="a")  # "=fast" now says: one holder, no line
    d, _hx, wx, wq = _keys(client, "mixed")[:4]
    now = _server_us(server)
    with server.admin() as admin:
        seq = int(admin.hget(d, "=seq") or 0)
        stamp = max(seq + 1, now)
        expires = now + 30_000_000
        # What a join of an earlier release writes: the record, the arrival stamp, the line
        # and the waiters' expiry index.
        admin.hset(d, mapping={"w:old": f"30000000 30000000 {stamp} {expires}", "=seq": stamp})
        admin.zadd(wq, {"old": stamp})
        admin.zadd(wx, {"old": expires})
    assert lease.release() is True
    status = lock.status()
    assert [h.holder for h in status.holders] == ["old"] and status.waiters == ()


def test_a_stale_or_lapsed_release_still_reports_it(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("stale", ttl=30)
    lock.acquire(timeout=1, holder="a").release()
    lease = lock.acquire(timeout=1, holder="a")
    assert lock.release("a", lease.token + 1) is False  # not this lease's token
    assert lease.release() is True
    short = client.lock("stale", ttl=0.3).acquire(timeout=1, holder="a")
    time.sleep(0.5)  # its lease has run out on the server
    assert short.release() is False
    assert lock.status().holders == ()
    again = lock.acquire(timeout=1, holder="b")
    assert again.token > short.token


def test_a_new_limit_on_an_idle_name_is_taken(client: turnstile.Client) -> None:
    client.lock("shape", ttl=30).acquire(timeout=1).release()
    sem = client.semaphore("shape", 3, ttl=30)
    leases = [sem.acquire(timeout=1) for _ in range(3)]
    assert sem.status().limit == 3
    assert not sem.try_acquire("one-more").acquired
    for lease in leases:
        lease.release()


def _waiter(
    client: turnstile.Client, name: str, handed: list[turnstile.Lease], waiters: int
) -> threading.Thread:
    """A thread that asks for ``name`` (its lease appended to ``handed``), started once the
    name has ``waiters - 1`` waiters, and returned once it is in line too."""
    lock = client.lock(name, ttl=30)
    thread = threading.Thread(target=lambda: handed.append(lock.acquire(timeout=10)))
    thread.start()
    assert wait_until(lambda: len(lock.status().waiters) == waiters, 10)
    return thread


def test_a_hand_over_to_the_last_waiter_leaves_the_name_on_the_fast_path(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """The release that hands over reads one waiter more than it grants, so it knows when
    it leaves the line empty: the new holder, alone then, releases on the fast path. With
    another waiter still in line, the new holder's release hands over in turn."""
    # The subscriber connection up first: a waiter whose join came before it looks again
    # with a step once it is up, which the counts below would see.
    assert client.backend.connection.listening().up  # type: ignore[attr-defined]
    first = client.lock("last", ttl=30).acquire(timeout=1)
    handed: list[turnstile.Lease] = []
    threads = [_waiter(client, "last", handed, 1), _waiter(client, "last", handed, 2)]
    assert first.release() is True
    threads[0].join(10)
    # Someone still waits: a full release step, which hands over (and publishes the wake-up).
    spent = _spent(server, handed[0].release)
    assert spent["script"] == 1 and spent["publish"] == 1, spent
    threads[1].join(10)
    # The line is empty now: the fast release (HMGET, TIME, HDEL, ZREM, HSET; and the PING
    # ahead of it).
    spent = _spent(server, handed[1].release)
    assert spent == {"ping": 1, "script": 1, "hmget": 1, "hdel": 1, "zrem": 1, "hset": 1}, spent
    # The name is idle again: the fast acquire, and tokens still grow.
    lock = client.lock("last", ttl=30)
    spent = _spent(server, lambda: handed.append(lock.acquire(timeout=1)))
    assert spent["script"] == 1 and "zrange" not in spent, spent
    assert handed[2].token > handed[1].token > handed[0].token
    handed[2].release()


KEEP_US = 3600 * 1_000_000  # _head.lua: every key outlives its latest entry by this much


def _covered(server: RedisProcess, client: turnstile.Client, name: str) -> bool:
    """Whether each of the name's zsets expires by itself no earlier than KEEP_US after its
    latest entry (HX, WX: by their scores; WQ: by its waiters' entries in WX)."""
    _d, hx, wx, wq = _keys(client, name)[:4]
    now = _server_us(server)
    with server.admin() as admin:
        expiry = {k: admin.pttl(k) for k in (hx, wx, wq)}
        latest = {k: [int(s) for _, s in admin.zrange(k, 0, -1, withscores=True)] for k in (hx, wx)}
        line = [m for m in admin.zrange(wq, 0, -1)]
        latest[wq] = [int(admin.zscore(wx, m) or 0) for m in line]
    for k, scores in latest.items():
        if scores and not (expiry[k] > 0 and now + expiry[k] * 1000 >= max(scores) + KEEP_US):
            return False
    return True


def test_a_join_costs_no_rank_check_and_no_position_read_on_an_empty_line(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """The holder's "=fast" record (one holder, nobody in line) tells the join the line is
    empty: no rank can collide (no ZCOUNT) and the waiter is next (no ZRANK). The join
    leaves "=fast" saying at most one holder and nobody in line with a negative lead, so
    the next join skips the ZCOUNT too; its position is read (someone is ahead), which shows
    the line and its expiry index were not made by this join: their expiry, given when
    "=exp" last moved ("=all"), already covers the new entry."""
    lock = client.lock("join", ttl=30)
    lock.acquire(timeout=1).release()  # scripts loaded; the name is idle
    holder = lock.acquire(timeout=1)
    ticket: list[turnstile.Ticket] = []
    waiting = client.lock("join", ttl=4)
    spent = _spent(server, lambda: ticket.append(waiting.try_acquire(holder="w1")))
    assert ticket[0].position == 0
    # HMGET, (TIME), ZRANGE of the holders, ZADD to the line and the expiry index, HSET, and
    # the expiry of the line and the index (both made again: they were empty).
    assert spent == {"script": 1, "hmget": 1, "zrange": 1, "zadd": 2, "hset": 1, "pexpireat": 2}
    spent = _spent(server, lambda: ticket.append(waiting.try_acquire(holder="w2")))
    assert ticket[1].position == 1
    assert spent == {"script": 1, "hmget": 1, "zrange": 1, "zadd": 2, "zrank": 1, "hset": 1}
    assert [w.holder for w in lock.status().waiters] == ["w1", "w2"]
    assert _covered(server, client, "join")
    holder.release()


def test_a_release_that_hands_over_costs_11_commands_in_its_script(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """The holder's release, handing over to the front waiter: "=fast" (at most one holder)
    tells it the caller was the only holder, so it does not count the holders; the grant
    goes into HX before the old holder leaves it, so HX is never empty and keeps its expiry
    (no PEXPIREAT: the grant ends before the old lease did, and before "=all"); one HDEL
    drops both records."""
    lock = client.lock("handover", ttl=30)
    lock.acquire(timeout=1).release()
    holder = lock.acquire(timeout=1)
    client.lock("handover", ttl=4).try_acquire(holder="w1")
    client.lock("handover", ttl=4).try_acquire(holder="w2")
    lock.release("nobody", 1)  # the release script is loaded
    spent = _spent(server, holder.release)
    # HMGET x 2 (the name, the front waiter), (TIME), ZRANGE of the line, ZREM x 3 (line,
    # waiters' expiry index, the old holder), ZADD of the grant, the PUBLISH of the wake-up
    # on the waiter's client's channel, HDEL of both records, HSET; and outside the script,
    # the PING sent ahead of it in the same write, so that the server writes the woken
    # waiter's message before the releaser's reply (RedisConnection._call).
    assert spent == {
        "ping": 1,
        "script": 1,
        "hmget": 2,
        "zrange": 1,
        "zrem": 3,
        "zadd": 1,
        "publish": 1,
        "hdel": 1,
        "hset": 1,
    }, spent
    status = lock.status()
    assert [h.holder for h in status.holders] == ["w1"]
    assert [w.holder for w in status.waiters] == ["w2"]
    assert _covered(server, client, "handover")


@pytest.mark.parametrize("case", ["old lease longer", "=all reaches", "neither"])
def test_hx_keeps_an_expiry_past_every_lease_whatever_a_release_skips(
    client: turnstile.Client, server: RedisProcess, case: str
) -> None:
    """A release that hands over gives HX no new expiry when it can tell HX already has one
    past the grant: HX was never empty (the old holder leaves it after the grant is in),
    and either the old lease lasted longer or "=all" reaches past the grant. When neither
    holds (here "=all" is made old, as if an earlier client had moved "=exp" since), it
    gives HX its expiry as before."""
    lock = client.lock("cover", ttl=30)
    lock.acquire(timeout=1).release()
    lock.release("nobody", 1)
    ttl = 30 if case == "old lease longer" else 2  # the lease the grant (20 s) replaces
    first = client.lock("cover", ttl=ttl).acquire(timeout=1)
    client.lock("cover", ttl=20).try_acquire(holder="w")
    if case == "neither":
        with server.admin() as admin:
            admin.hset(_keys(client, "cover")[0], "=all", "1")
    spent = _spent(server, first.release)
    assert [h.holder for h in lock.status().holders] == ["w"]
    assert spent.get("pexpireat", 0) == (1 if case == "neither" else 0), spent
    assert _covered(server, client, "cover")


def test_a_second_holder_written_by_a_client_without_fast_paths_is_counted(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """The name's "=fast" said at most one holder (the join wrote it); a client that knows
    nothing of it then adds a holder (taking a token, as every grant does): the release must
    count the holders again and grant nobody."""
    lock = client.lock("two", ttl=30)
    lock.acquire(timeout=1, holder="a").release()
    lease = lock.acquire(timeout=1, holder="a")
    assert client.lock("two", ttl=30).try_acquire(holder="w").position == 0
    d, hx = _keys(client, "two")[:2]
    now = _server_us(server)
    with server.admin() as admin:
        token = max(int(admin.hget(d, "=last")) + 1, now)
        admin.hset(d, mapping={"h:old": f"{token} {now} {now + 30_000_000} 1", "=last": token})
        admin.zadd(hx, {"old": now + 30_000_000})
    assert lease.release() is True
    status = lock.status()
    assert [h.holder for h in status.holders] == ["old"]
    assert [w.holder for w in status.waiters] == ["w"]


def _join(client: turnstile.Client, name: str, holder: str, priority: int) -> None:
    backend = client.backend
    step = {"ttl": 60.0, "wait_ttl": 60.0, "ageing": 1e-6}  # lead = priority, in us
    backend.acquire(name, holder, limit=1, enqueue=True, priority=priority, **step)


@pytest.mark.parametrize("old", [False, True], ids=["ours", "earlier-client"])
def test_a_join_after_a_negative_priority_still_looks_for_a_rank_collision(
    client: turnstile.Client, server: RedisProcess, old: bool
) -> None:
    """A waiter with a negative lead ranks after its own stamp, so a later stamp may meet
    its rank: the join that follows looks (ZCOUNT) and arrives 1 us later, whether that
    waiter was put in line by this client (which then stops saying "no negative lead") or
    by one that knows nothing of "=fast" (its join took a stamp, which voids the record)."""
    name = "neg"
    lock = client.lock(name, ttl=60)
    assert lock.try_acquire(holder="first").lease is not None
    d, _hx, wx, wq = _keys(client, name)[:4]
    start = _server_us(server) + 60_000_000
    with server.admin() as admin:
        admin.hset(d, "=seq", str(start))  # stamps known: the clock is behind "=seq"
    _join(client, name, "w0", 0)  # start + 1; "=fast" now: no negative lead
    if old:
        # What a join of an earlier release writes for priority -1 (lead -1 us).
        stamp, expires = start + 2, _server_us(server) + 60_000_000
        with server.admin() as admin:
            admin.hset(
                d, mapping={"w:ng": f"60000000 60000000 {stamp} {expires}", "=seq": stamp}
            )
            admin.zadd(wq, {"ng": stamp + 1})
            admin.zadd(wx, {"ng": expires})
    else:
        _join(client, name, "ng", -1)  # stamp start + 2, rank start + 3
    # stamp start + 3 would rank start + 3, ng's rank: it arrives at start + 4 instead
    # (a sorted set would otherwise put "aa" ahead of "ng").
    spent = _spent(server, lambda: _join(client, name, "aa", 0))
    assert spent.get("zcount") == 2, spent
    status = lock.status()
    assert [w.holder for w in status.waiters] == ["w0", "ng", "aa"]
    stamps = [ranking.stamp_of(w.joined_at) - start for w in status.waiters]
    assert stamps == [1, 2, 4]
    # "=fast" still says at most one holder ("1w"): the release hands over without
    # counting the holders (its only ZRANGE reads the line).
    first = status.holders[0]
    spent = _spent(server, lambda: lock.release(first.holder, first.token))
    assert spent.get("zrange") == 1 and "zcount" not in spent, spent
    assert [h.holder for h in lock.status().holders] == ["w0"]


def test_a_release_goes_out_with_a_ping_ahead_of_it_in_one_write(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """A release is sent as PING + its script on one connection in one write, so the PING's
    reply queues the releaser before the script's PUBLISH queues the waiter's subscriber
    connection, and Redis (which writes the clients of one event-loop turn last-queued
    first) writes the woken waiter's message before the releaser's reply
    (RedisConnection._call). The other steps go alone. MONITOR lists each client's commands
    in the order the server ran them."""
    assert client.backend.connection.listening().up  # type: ignore[attr-defined]
    first = client.lock("ordered", ttl=30).acquire(timeout=1)
    handed: list[turnstile.Lease] = []
    thread = _waiter(client, "ordered", handed, 1)
    seen: list[tuple[str, str]] = []  # (client, command) as MONITOR shows them
    started = threading.Event()

    def monitor() -> None:
        with server.admin(timeout=10) as admin, admin.monitor() as m:
            started.set()
            for entry in m.listen():
                if "monitor-done" in str(entry["command"]):
                    return
                client_id = f"{entry.get('client_address')}:{entry.get('client_port')}"
                seen.append((client_id, str(entry["command"])))

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    assert started.wait(10)
    time.sleep(0.2)  # MONITOR is on once its first reply came; give it a moment more
    assert first.release() is True
    thread.join(10)
    assert handed and handed[0].release() is True
    with server.admin() as admin:
        admin.echo("monitor-done")  # the last command the monitor thread reads
    watcher.join(10)
    fcalls = [i for i, (_, cmd) in enumerate(seen) if cmd.startswith("FCALL ")]
    releases = [i for i in fcalls if "_release " in seen[i][1]]
    assert len(releases) == 2, seen  # the hand-over, then the new holder's release
    for i in releases:
        mine = [cmd for addr, cmd in seen[:i] if addr == seen[i][0]]
        assert mine and mine[-1] == "PING", seen
    for i in fcalls:
        if i not in releases:  # the acquire steps: no PING of theirs ahead of them
            mine = [cmd for addr, cmd in seen[:i] if addr == seen[i][0]]
            assert not mine or mine[-1] != "PING", seen
