"""What each lock step sends to Redis (layout 2, lua/lock/_lib.lua), counted exactly with
INFO commandstats (the commands inside scripts and functions included, TIME left out): a
hand-over is the waiter's join (its script; HMGET, ZADD, HSET) and the holder's release (a
PING, its script; HMGET, ZPOPMIN, PUBLISH, HSET), 11 with the two TIMEs. And what each key
holds: the holders in the name's record, each waiting entry in its member of the line, the
line's sentinel keeping its expiry while it is empty, every key expiring by itself."""

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

KEEP_US = 3600 * 1_000_000  # _head.lua: every key outlives its latest entry by this much


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    with redis_process(tmp_path / "redis", "--appendonly", "no") as srv:
        yield srv


@pytest.fixture
def client(server: RedisProcess) -> Iterator[turnstile.Client]:
    client = turnstile.connect(server.url + "?prefix=tt-cmd:")
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


def _waiter(
    client: turnstile.Client, name: str, handed: list[turnstile.Lease], waiters: int
) -> threading.Thread:
    """A thread that asks for ``name`` with a blocking acquire (its lease appended to
    ``handed``), started once the name has ``waiters - 1`` waiters, and returned once it is
    in line too."""
    lock = client.lock(name, ttl=30)
    thread = threading.Thread(target=lambda: handed.append(lock.acquire(timeout=10)))
    thread.start()
    assert wait_until(lambda: len(lock.status().waiters) == waiters, 10)
    return thread


def _covered(server: RedisProcess, client: turnstile.Client, name: str) -> None:
    """Every key of the name expires by itself, no earlier than KEEP_US after the latest
    entry in it (the holders' leases and the waiting entries)."""
    d, line = _keys(client, name)[:2]
    lock = client.lock(name)
    status = lock.status()
    latest = max(
        [round(h.expires_at * 1e6) for h in status.holders]
        + [round(w.expires_at * 1e6) for w in status.waiters]
        + [0]
    )
    now = _server_us(server)
    with server.admin() as admin:
        for key in (d, line):
            if admin.exists(key):
                left = admin.pttl(key)
                assert left > 0, key
                assert now + left * 1000 >= latest + KEEP_US - 5_000_000, key


def test_an_idle_name_costs_three_commands_per_acquire_and_four_per_release(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("idle", ttl=30)
    lock.acquire(timeout=1).release()  # functions loaded, the name's expiry set
    leases: list[turnstile.Lease] = []

    def cycles() -> None:
        for _ in range(10):
            leases.append(lock.acquire(timeout=1))
            assert leases[-1].release() is True

    spent = _spent(server, cycles)
    # Per cycle: acquire = its script, HMGET, HSET; release = the PING sent ahead of every
    # release (RedisConnection._call: a woken waiter is written first), its script, HMGET,
    # HSET. The keys' expiry moves SLACK_US (300 s) ahead at a time: not in these cycles.
    assert spent == {"ping": 10, "script": 20, "hmget": 20, "hset": 20}, spent
    assert lock.acquire(timeout=1).token > leases[-1].token  # tokens still grow


def test_a_new_name_is_one_record_with_an_expiry_until_someone_waits(
    client: turnstile.Client, server: RedisProcess
) -> None:
    client.lock("warm", ttl=30).acquire(timeout=1).release()  # functions loaded
    lock = client.lock("brand-new", ttl=30)
    leases: list[turnstile.Lease] = []
    spent = _spent(server, lambda: leases.append(lock.acquire(timeout=1)))
    assert spent == {"script": 1, "hmget": 1, "hset": 1, "pexpireat": 1}, spent
    d, line = _keys(client, "brand-new")[:2]
    with server.admin() as admin:
        record = admin.hgetall(d)
        assert admin.pttl(d) > 0 and not admin.exists(line)
    assert record[b"=name"] == b"brand-new" and record[b"=layout"] == b"2"
    assert record[b"=limit"] == b"1" and record[b"=last"] == str(leases[0].token).encode()
    holder = leases[0].holder.encode()
    assert record[b"=hn"] == b"%d:%s" % (len(holder), holder)
    assert record[b"=hr"].startswith(b"%d:%d " % (len(record[b"=hr"]) - 3, leases[0].token))
    assert not any(k.startswith((b"h:", b"w:")) for k in record)
    with server.admin() as admin:
        # Every value under 64 bytes: Redis keeps the hash in its compact encoding.
        assert admin.object("encoding", d) == b"listpack"
    assert leases[0].release() is True
    with server.admin() as admin:
        assert admin.hget(d, "=hn") == b"" and admin.object("encoding", d) == b"listpack"


def test_a_hand_over_costs_the_join_four_and_the_release_five_commands(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """A blocking acquire's own holder is not indexed (its client gives its entry back):
    the join is HMGET, ZADD, HSET and the release HMGET, ZPOPMIN, PUBLISH, HSET, besides
    the scripts, the PING and the TIMEs."""
    assert client.backend.connection.listening().up  # type: ignore[attr-defined]
    lock = client.lock("handover", ttl=30)
    lock.acquire(timeout=1).release()
    first = lock.acquire(timeout=1)
    handed: list[turnstile.Lease] = []
    _waiter(client, "handover", handed, 1)  # the first join makes the line (and its expiry)
    joins: list[dict[str, int]] = []
    threads: list[threading.Thread] = []

    def second() -> None:
        threads.append(_waiter(client, "handover", handed, 2))

    joins.append(_spent(server, second))
    # The join (and the status reads of the helper, which are not counted here: only the
    # lines that name the join's commands are checked).
    assert joins[0]["zadd"] == 1 and joins[0]["hset"] == 1 and "zrank" not in joins[0], joins
    spent = _spent(server, first.release)
    assert spent == {"ping": 1, "script": 1, "hmget": 1, "zpopmin": 1, "publish": 1, "hset": 1}
    assert wait_until(lambda: len(handed) == 1, 10)
    spent = _spent(server, handed[0].release)  # hands over to the second waiter
    assert spent == {"ping": 1, "script": 1, "hmget": 1, "zpopmin": 1, "publish": 1, "hset": 1}
    threads[0].join(10)
    assert len(handed) == 2 and handed[1].token > handed[0].token > first.token
    _covered(server, client, "handover")
    # The line is empty now; its sentinel keeps the key, and its expiry, for the next join.
    _d, line = _keys(client, "handover")[:2]
    with server.admin() as admin:
        assert admin.zrange(line, 0, -1, withscores=True) == [(b"~", float("inf"))]
        assert admin.pttl(line) > 0
    spent = _spent(server, handed[1].release)
    assert spent == {"ping": 1, "script": 1, "hmget": 1, "hset": 1}, spent


def test_a_join_costs_four_commands_and_says_its_position_without_a_rank(
    client: turnstile.Client, server: RedisProcess
) -> None:
    lock = client.lock("join", ttl=30)
    holder = lock.acquire(timeout=1)
    ticket: list[turnstile.Ticket] = []
    waiting = client.lock("join", ttl=4)
    spent = _spent(server, lambda: ticket.append(waiting.try_acquire(holder="w1")))
    assert ticket[0].position == 0
    # HMGET, ZADD (with the sentinel, which makes the line), HSET (the entry's index field:
    # a ticket's holder is indexed), and the new line's expiry.
    assert spent == {"script": 1, "hmget": 1, "zadd": 1, "hset": 1, "pexpireat": 1}, spent
    spent = _spent(server, lambda: ticket.append(waiting.try_acquire(holder="w2")))
    assert ticket[1].position == 1
    assert spent == {"script": 1, "hmget": 1, "zadd": 1, "hset": 1}, spent
    # w1 asks again: found by its index field (its entry's score), its place kept with a
    # new expiry (the member carries it), its position read; nothing of the record changes.
    spent = _spent(server, lambda: ticket.append(waiting.try_acquire(holder="w1")))
    assert ticket[2].position == 0
    assert spent == {"script": 1, "hmget": 1, "zrangebyscore": 1, "zrem": 1, "zadd": 1,
                     "zrank": 1}, spent
    assert [w.holder for w in lock.status().waiters] == ["w1", "w2"]
    _covered(server, client, "join")
    # The release hands over to w1: its index field goes (one HDEL).
    spent = _spent(server, holder.release)
    assert spent == {"ping": 1, "script": 1, "hmget": 1, "zpopmin": 1, "publish": 1,
                     "hdel": 1, "hset": 1}, spent
    d = _keys(client, "join")[0]
    with server.admin() as admin:
        assert not admin.hexists(d, "w:w1") and admin.hexists(d, "w:w2")


def test_a_blocking_waiter_gives_its_entry_back_and_leaves_by_it(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """A blocking acquire's entry is not indexed: its client keeps it (Entries in the Redis
    backend) and gives it back to keep its place, and to leave the line on a timeout."""
    lock = client.lock("private", ttl=30)
    holder = lock.acquire(timeout=1)
    d = _keys(client, "private")[0]
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            client.lock("private", ttl=0.6).acquire(timeout=3)  # renews its place every 0.2 s
        except turnstile.AcquireTimeout as exc:
            failed.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    assert wait_until(lambda: len(lock.status().waiters) == 1, 5)
    with server.admin() as admin:
        assert not any(k.startswith(b"w:") for k in admin.hkeys(d))
        joined = lock.status().waiters[0]
        assert wait_until(lambda: lock.status().waiters[0].expires_at > joined.expires_at, 5)
        assert lock.status().waiters[0].joined_at == joined.joined_at  # the same place
    thread.join(10)
    assert failed and lock.status().waiters == ()
    with server.admin() as admin:
        assert admin.hget(d, "=n") == b"0"
        assert len(client.backend._entries) == 0  # type: ignore[attr-defined]
    holder.release()


def test_a_private_step_whose_reply_was_lost_finds_its_entry_by_reading_the_line(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """A blocking acquire whose step failed with its outcome unknown (a lost reply, a
    cancellation) may be in line under an entry its client never learnt: its next steps,
    and the one that leaves the line, look for the holder in the whole line instead of
    joining a second time."""
    lock = client.lock("lost", ttl=30)
    holder = lock.acquire(timeout=1)
    backend = client.backend
    entries = backend._entries  # type: ignore[attr-defined]
    ask = {"limit": 1, "ttl": 30.0, "wait_ttl": 30.0, "enqueue": True, "private": True}
    assert backend.acquire("lost", "me", **ask).position == 0  # type: ignore[arg-type]
    entries.remember("lost", "me", entries.UNKNOWN, 30.0)  # as a failed step leaves it
    spent = _spent(server, lambda: backend.acquire("lost", "me", **ask))  # type: ignore[arg-type]
    assert spent["zrange"] == 1 and "zadd" in spent, spent  # the line read; the place kept
    assert [w.holder for w in lock.status().waiters] == ["me"]  # not in line twice
    assert entries.get("lost", "me") not in (None, entries.UNKNOWN)
    entries.remember("lost", "me", entries.UNKNOWN, 30.0)
    assert backend.release("lost", "me", None) is True
    assert lock.status().waiters == () and entries.get("lost", "me") is None
    holder.release()


def test_an_entry_that_lapsed_is_swept_and_the_line_counts_again(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """"=wdue" bounds the entries' expiries from below; once it is past, a step reads the
    line, drops what lapsed, and counts the rest: positions stay exact."""
    lock = client.lock("sweep", ttl=30)
    holder = lock.acquire(timeout=1)
    assert lock.try_acquire(holder="a", wait_ttl=30).position == 0
    assert lock.try_acquire(holder="b", wait_ttl=0.3).position == 1
    assert lock.try_acquire(holder="c", wait_ttl=30).position == 2
    time.sleep(0.4)
    spent = _spent(server, lambda: lock.try_acquire(holder="c", wait_ttl=30))
    assert spent["zrange"] == 1 and spent["zrem"] == 2, spent  # the sweep; b's entry, c's
    assert [w.holder for w in lock.status().waiters] == ["a", "c"]
    assert lock.try_acquire(holder="c", wait_ttl=30).position == 1
    d = _keys(client, "sweep")[0]
    with server.admin() as admin:
        assert admin.hget(d, "=n") == b"2" and not admin.hexists(d, "w:b")
    holder.release()


def test_a_join_after_a_negative_priority_looks_for_a_rank_collision(
    client: turnstile.Client, server: RedisProcess
) -> None:
    """A waiter with a negative lead ranks after its own stamp, so a later stamp may meet
    its rank: the join that follows looks (ZCOUNT) and arrives 1 us later ("=neg")."""
    name = "neg"
    lock = client.lock(name, ttl=60)
    assert lock.try_acquire(holder="first").lease is not None
    d = _keys(client, name)[0]
    start = _server_us(server) + 60_000_000
    with server.admin() as admin:
        admin.hset(d, "=seq", str(start))  # stamps known: the clock is behind "=seq"

    def join(holder: str, lead: int) -> None:
        args = [name, holder, 1, 60_000_000, 60_000_000, 1, "", lead, "", "", "", "", 1]
        client.backend._run("acquire", name, args)  # type: ignore[attr-defined]

    join("w0", 0)  # stamp start + 1
    join("ng", -1)  # stamp start + 2, rank start + 3
    spent = _spent(server, lambda: join("aa", 0))  # start + 3 would meet it: start + 4
    assert spent.get("zcount") == 2, spent
    status = lock.status()
    assert [w.holder for w in status.waiters] == ["w0", "ng", "aa"]
    stamps = [ranking.stamp_of(w.joined_at) - start for w in status.waiters]
    assert stamps == [1, 2, 4]


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
