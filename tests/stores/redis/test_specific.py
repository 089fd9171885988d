"""What only the Redis backend has to show: scripts loaded once, every key under the prefix
with an expiry and one slot per name, constant work per hand-over, URL and connection errors
that name the problem, and the async flavour on a real server and Cluster."""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

import turnstile
import turnstile.aio
from turnstile._core import timing
from turnstile.stores.redis import keys as redis_keys

from ._tools import RedisProcess, free_port, redis_process

pytestmark = pytest.mark.redis

ODD_NAMES = [
    "plain",
    "{}",
    "{a}",
    "{a}x",
    "x{a}",
    "}{",
    "with space",
    "quote'\"",
    "emoji 🚦",
    "a:b:c",
    "' OR 1=1 --",
    "n" * 4000,
]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    with redis_process(tmp_path / "redis", "--appendonly", "no") as srv:
        yield srv


def _cluster_url() -> str:
    url = os.environ.get("TURNSTILE_TEST_REDIS_CLUSTER_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("TURNSTILE_TEST_REDIS_CLUSTER_URL is not set under CI")
        pytest.skip("TURNSTILE_TEST_REDIS_CLUSTER_URL is not set (scripts/dev.py test sets it)")
    return url


def _exercise(client: turnstile.Client, name: str) -> None:
    """Leave a holder, a waiter and a pending wake-up signal on ``name``."""
    lock = client.lock(name, ttl=30)
    first = lock.try_acquire(holder="first")
    assert first.lease is not None
    assert lock.try_acquire(holder="second").position == 0
    assert lock.try_acquire(holder="third").position == 1
    assert first.lease.release()  # hands over to "second": a signal list appears
    assert [h.holder for h in lock.status().holders] == ["second"]


def _lock_library_calls(lock: turnstile.Lock, rounds: int = 20) -> None:
    for _ in range(rounds):
        lease = lock.acquire(timeout=1)
        lease.renew()
        lock.status()
        lease.release()


def test_scripts_are_loaded_once(server: RedisProcess) -> None:
    # functions=off: the lock steps run as scripts (EVALSHA), as on a server before Redis 7.
    client = turnstile.connect(server.url + "?prefix=tt-scripts:&functions=off")
    try:
        lock = client.lock("job", ttl=5)
        _lock_library_calls(lock)
        client.names()
        stats = server.commandstats(raw=True)
        assert stats.get("script|load") == 5  # acquire, renew, status, release, probe: once each
        assert "eval" not in stats  # the source is never sent with a call
        assert stats["evalsha"] == 20 * 4 + 1 + 5  # every call, plus one NOSCRIPT per script
        assert "fcall" not in stats and "function|load" not in stats

        # A second client on the same server finds them loaded; after SCRIPT FLUSH (as after
        # a restart or failover) each is loaded again, once.
        other = turnstile.connect(server.url + "?prefix=tt-scripts:&functions=off")
        other.lock("job", ttl=5).acquire(timeout=1).release()
        other.close()
        assert server.commandstats(raw=True)["script|load"] == 5
        with server.admin() as admin:
            admin.script_flush()
        for _ in range(3):
            lock.acquire(timeout=1).release()
        assert server.commandstats(raw=True)["script|load"] == 7
    finally:
        client.close()


def _libraries(server: RedisProcess) -> list[str]:
    with server.admin() as admin:
        listed = [dict(zip(lib[::2], lib[1::2], strict=True)) for lib in admin.function_list()]
    return sorted(lib[b"library_name"].decode() for lib in listed)


def test_the_lock_steps_run_as_functions_loaded_once(server: RedisProcess) -> None:
    client = turnstile.connect(server.url + "?prefix=tt-functions:")
    try:
        lock = client.lock("job", ttl=5)
        _lock_library_calls(lock)
        client.names()
        stats = server.commandstats(raw=True)
        # One library, loaded by the first call, which found no function (one failed FCALL).
        assert stats.get("function|load") == 1
        assert stats["fcall"] == 20 * 4 + 1 + 1
        assert "evalsha" not in stats and "script|load" not in stats and "eval" not in stats
        (library,) = _libraries(server)
        assert library.startswith("turnstile_lock_")

        # Another client of this release finds it loaded; after FUNCTION FLUSH (as after a
        # restart of a server that keeps no data) it is loaded again, once.
        other = turnstile.connect(server.url + "?prefix=tt-functions:")
        other.lock("job", ttl=5).acquire(timeout=1).release()
        other.close()
        assert server.commandstats(raw=True)["function|load"] == 1
        with server.admin() as admin:
            admin.function_flush()
        for _ in range(3):
            lock.acquire(timeout=1).release()
        assert server.commandstats(raw=True)["function|load"] == 2
        assert _libraries(server) == [library]
    finally:
        client.close()


@pytest.mark.parametrize("refused", ["-function", "-fcall"])
def test_a_user_who_may_not_load_functions_runs_the_scripts(
    server: RedisProcess, caplog: pytest.LogCaptureFixture, refused: str
) -> None:
    # Refused FUNCTION LOAD (after a first FCALL found nothing), or refused FCALL itself (as
    # a server before Redis 7 answers "unknown command"): scripts from then on.
    with server.admin() as admin:
        admin.acl_setuser(
            "scripts-only",
            enabled=True,
            passwords=["+pw-9f1c"],
            keys=["*"],
            commands=["+@all", refused],
        )
    url = f"redis://scripts-only:pw-9f1c@127.0.0.1:{server.port}/0?prefix=tt-nofunctions:"
    caplog.set_level("INFO", logger="turnstile.redis")
    client = turnstile.connect(url)
    try:
        lock = client.lock("job", ttl=5)
        _lock_library_calls(lock, rounds=3)
        stats = server.commandstats(raw=True)
        assert _libraries(server) == []
        assert stats["evalsha"] >= 3 * 4
        fcalls = stats.get("fcall", 0)
        _lock_library_calls(lock, rounds=3)
        assert server.commandstats(raw=True).get("fcall", 0) == fcalls  # never asked again
        said = [r.getMessage() for r in caplog.records if "sending scripts" in r.getMessage()]
        assert len(said) == 1 and "pw-9f1c" not in said[0], said
    finally:
        client.close()


def test_a_server_before_redis_7_is_sent_scripts_from_the_start(
    server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The version the server gives at connect says there are no functions: no FCALL is
    # tried (this server is 7.x, told to say 6.2 while the client connects).
    real_info = redis.Redis.info

    def info(self: redis.Redis, *args: object, **kwargs: object) -> object:
        found = real_info(self, *args, **kwargs)  # type: ignore[arg-type]
        if isinstance(found, dict) and "redis_version" in found:
            found = {**found, "redis_version": "6.2.14"}
        return found

    monkeypatch.setattr(redis.Redis, "info", info)
    client = turnstile.connect(server.url + "?prefix=tt-six:")
    monkeypatch.undo()
    try:
        _lock_library_calls(client.lock("job", ttl=5), rounds=3)
        stats = server.commandstats(raw=True)
        assert "fcall" not in stats and "function|load" not in stats
        assert stats["evalsha"] >= 3 * 4
    finally:
        client.close()


def test_clients_running_scripts_and_functions_share_a_name(server: RedisProcess) -> None:
    as_functions = turnstile.connect(server.url + "?prefix=tt-mixed:")
    as_scripts = turnstile.connect(server.url + "?prefix=tt-mixed:&functions=off")
    try:
        tokens = []
        for first, second in ((as_functions, as_scripts), (as_scripts, as_functions)):
            holder = first.lock("shared", ttl=30).acquire(timeout=1)
            queued = second.lock("shared", ttl=30).try_acquire(holder="next")
            assert queued.position == 0
            assert holder.release()  # hands over to "next", whatever runs the other's steps
            lease = second.lock("shared", ttl=30).acquire(holder="next", timeout=1)
            tokens += [holder.token, lease.token]
            assert lease.release()
        assert tokens == sorted(tokens) and len(set(tokens)) == 4
        stats = server.commandstats(raw=True)
        assert stats["fcall"] > 0 and stats["evalsha"] > 0
    finally:
        as_functions.close()
        as_scripts.close()


@pytest.mark.parametrize("functions", ["on", "off"])
def test_queue_and_rate_steps_take_the_same_path(server: RedisProcess, functions: str) -> None:
    # Queue and rate-limit steps load and run as the lock steps do: as functions of their
    # folder's library, or as scripts with functions=off; loaded again after a flush (as after
    # a restart or failover), once per flush, never sent with a call.
    client = turnstile.connect(server.url + f"?prefix=tt-qscripts:&functions={functions}")
    load = "function|load" if functions == "on" else "script|load"
    try:
        q = client.queue("jobs")
        limit = client.rate_limit("calls", rate=1000, per=1)
        q.put({"n": 1})
        limit.acquire(timeout=1)
        loaded = server.commandstats(raw=True)[load]
        assert loaded == 2  # the queue's and the rate limit's: one each
        with server.admin() as admin:
            if functions == "on":
                admin.function_flush()
            else:
                admin.script_flush()
        q.put({"n": 2})  # not found: loaded again, then run
        q.put({"n": 3})
        limit.acquire(timeout=1)
        stats = server.commandstats(raw=True)
        assert stats[load] == loaded + 2  # once per flush and library, not per call
        assert [q.get(timeout=1) is not None for _ in range(3)] == [True] * 3
        stats = server.commandstats(raw=True)
        assert "eval" not in stats  # the source is never sent with a call
        assert (stats.get("fcall", 0) > 0) == (functions == "on")
        assert (stats.get("evalsha", 0) > 0) == (functions == "off")
    finally:
        client.close()


def test_keys_live_under_the_prefix_expire_and_share_one_slot_per_name(
    server: RedisProcess,
) -> None:
    prefix = "tt-keys:"
    client = turnstile.connect(server.url + f"?prefix={prefix}")
    try:
        for name in ODD_NAMES:
            _exercise(client, name)
        assert client.names() == sorted(ODD_NAMES)
    finally:
        client.close()
    with server.admin() as admin:
        keys = [k.decode() for k in admin.scan_iter(count=1000)]
        by_slot: dict[int, set[str]] = defaultdict(set)
        tags = set()
        for key in keys:
            assert key.startswith(prefix), key
            tag = key[len(prefix) :].split("}", 1)[0] + "}"
            tags.add(tag)
            by_slot[key_slot(key.encode())].add(tag)
            assert admin.pttl(key) > 0, f"{key} has no expiry"
        assert len(tags) == len(ODD_NAMES)  # no two names share keys
        for name in ODD_NAMES:  # each name's keys in one slot (wake-ups are not keys)
            base = redis_keys.key_base(prefix, name)
            mine = [k for k in keys if k.startswith(base)]
            assert sorted(k[len(base) :] for k in mine) == ["d", "l"]
            assert len({key_slot(k.encode()) for k in mine}) == 1
            assert admin.hget(base + "d", "=name") == name.encode()  # the name is data


def test_handover_costs_the_same_with_2_and_32_waiters(server: RedisProcess) -> None:
    client = turnstile.connect(server.url + "?prefix=tt-cost:")
    try:
        costs = {}
        for waiters in (2, 32):
            lock = client.lock(f"line-{waiters}", ttl=30)
            holder = lock.try_acquire(holder="h")
            assert holder.lease is not None
            for i in range(waiters):
                lock.try_acquire(holder=f"w{i}")
            lock.status()  # loads every script used below before counting
            lock.release("nobody", 1)
            before = sum(server.commandstats().values())
            holder.lease.release()  # one hand-over to w0 ...
            claimed = lock.try_acquire(holder="w0")  # ... and w0 claiming it
            after = sum(server.commandstats().values())
            assert claimed.acquired
            costs[waiters] = after - before - 1  # less the INFO that reads the stats
        assert costs[2] == costs[32], costs
    finally:
        client.close()


def test_names_with_braces_spread_over_slots() -> None:
    # A name's own braces never pick its slot: "{same}1", "{same}2", ... are spread.
    slots = {key_slot(redis_keys.key_base("p:", f"{{same}}{i}").encode()) for i in range(50)}
    assert len(slots) > 40


def test_unknown_url_option_is_refused() -> None:
    with pytest.raises(turnstile.ConfigurationError, match=r"'colour'.*supported: prefix"):
        turnstile.connect("redis://127.0.0.1:6379/0?colour=blue")
    with pytest.raises(turnstile.ConfigurationError, match="socket_timeout"):
        turnstile.connect("redis://127.0.0.1:6379/0?socket_timeout=-1")
    with pytest.raises(turnstile.ConfigurationError, match=r"functions='maybe'.*true or false"):
        turnstile.connect("redis://127.0.0.1:6379/0?functions=maybe")
    with pytest.raises(turnstile.ConfigurationError, match="must not contain"):
        turnstile.connect("redis://127.0.0.1:6379/0?prefix=a{b}")
    with pytest.raises(turnstile.ConfigurationError, match="database number"):
        turnstile.connect("redis://127.0.0.1:6379/zero")
    with pytest.raises(turnstile.ConfigurationError, match=r"redis\+cluster://"):
        turnstile.connect("redis://127.0.0.1:6379,127.0.0.1:6380/0")


def test_unreachable_server_fails_at_once_without_the_password() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(turnstile.BackendUnavailable) as info:
        turnstile.connect(f"redis://user:s3cret-pw@127.0.0.1:{port}/0")
    assert time.monotonic() - started < 5
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "s3cret-pw" not in str(info.value)
    assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)


def test_wrong_password_is_a_configuration_error(tmp_path: Path) -> None:
    with redis_process(tmp_path / "auth", "--requirepass", "right-pw") as srv:
        with pytest.raises(turnstile.ConfigurationError) as info:
            turnstile.connect(f"redis://:wrong-pw@127.0.0.1:{srv.port}/0")
        assert "wrong-pw" not in str(info.value) and "right-pw" not in str(info.value)
        assert "***" in str(info.value)
        with pytest.raises(turnstile.ConfigurationError):
            turnstile.connect(f"redis://127.0.0.1:{srv.port}/0")
        client = turnstile.connect(f"redis://:right-pw@127.0.0.1:{srv.port}/0?prefix=tt-auth:")
        try:
            client.lock("x").acquire(timeout=1).release()
        finally:
            client.close()


def test_cluster_url_on_a_single_server_is_refused(server: RedisProcess) -> None:
    with pytest.raises(turnstile.ConfigurationError, match="not a Redis Cluster"):
        turnstile.connect(f"redis+cluster://127.0.0.1:{server.port}")


def test_single_server_url_on_a_cluster_node_is_refused() -> None:
    url = _cluster_url().replace("redis+cluster://", "redis://", 1)
    with pytest.raises(turnstile.ConfigurationError, match=r"redis\+cluster://"):
        turnstile.connect(url)


@pytest.mark.redis_cluster
def test_cluster_keys_of_a_name_share_a_slot_and_names_spread() -> None:
    prefix = f"tt-{secrets.token_hex(5)}:"
    url = _cluster_url()
    client = turnstile.connect(f"{url}?prefix={prefix}")
    admin = redis.cluster.RedisCluster.from_url(url.replace("redis+cluster://", "redis://", 1))
    try:
        names = [f"{{same}}{i}" for i in range(12)] + ODD_NAMES[:6]
        for name in names:
            _exercise(client, name)
        assert client.names() == sorted(names)
        nodes = set()
        for name in names:
            base = redis_keys.key_base(prefix, name)
            slot = admin.cluster_keyslot(base + "d")
            for suffix in ("l", "cw", "pd", "s:second"):
                assert admin.cluster_keyslot(base + suffix) == slot
            nodes.add(admin.get_node_from_key(base + "d").name)
            assert admin.exists(base + "d", base + "l") == 2
        assert len(nodes) >= 2  # names are spread over the masters
    finally:
        client.close()
        keys = list(admin.scan_iter(match=f"{prefix}*", target_nodes=admin.PRIMARIES))
        for key in keys:
            admin.delete(key)
        admin.close()


@pytest.mark.parametrize("where", ["single", "cluster"])
async def test_async_handover_wakes_the_next_waiter(where: str, server: RedisProcess) -> None:
    base = server.url if where == "single" else _cluster_url()
    prefix = f"tt-{secrets.token_hex(5)}:"
    client = await turnstile.aio.connect(f"{base}?prefix={prefix}")
    try:
        lock = client.lock("async", ttl=5)
        order: list[int] = []
        first = await lock.acquire(timeout=1)

        async def waiter(i: int) -> None:
            lease = await lock.acquire(timeout=10)
            order.append(i)
            await asyncio.sleep(0.01)
            await lease.release()

        tasks = []
        for i in range(4):
            tasks.append(asyncio.create_task(waiter(i)))
            for _ in range(200):
                if len((await lock.status()).waiters) == i + 1:
                    break
                await asyncio.sleep(0.005)
        started = time.monotonic()
        await first.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert order == [0, 1, 2, 3]
        assert time.monotonic() - started < 1.0  # woken, not heartbeats (1.67 s)
    finally:
        await client.close()
        if where == "cluster":
            admin = redis.cluster.RedisCluster.from_url(
                _cluster_url().replace("redis+cluster://", "redis://", 1)
            )
            for key in list(admin.scan_iter(match=f"{prefix}*", target_nodes=admin.PRIMARIES)):
                admin.delete(key)
            admin.close()


def test_woken_waiter_holds_the_grant_its_wake_up_carried(server: RedisProcess) -> None:
    """The wake-up carries the grant: a hand-over costs the release script and the BLPOP,
    nothing more; the waiter's lease deadline is conservative; a renewal later claims the
    short unclaimed lease for the full ttl."""
    client = turnstile.connect(server.url + "?prefix=tt-handed:")
    waiter_client = turnstile.connect(server.url + "?prefix=tt-handed:")
    try:
        lock = client.lock("job", ttl=30)
        holder = lock.acquire(timeout=1)
        lock.release("nobody", 1)  # load the release script before counting
        got: dict[str, object] = {}

        def wait() -> None:
            got["lease"] = waiter_client.lock("job", ttl=30).acquire(timeout=10)

        thread = threading.Thread(target=wait)
        thread.start()
        deadline = time.monotonic() + 10
        while not lock.status().waiters and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the waiter blocks a while before the hand-over
        before = server.commandstats()
        holder.release()
        thread.join(10)
        after = server.commandstats()
        lease = got["lease"]
        assert isinstance(lease, turnstile.Lease)
        assert after["script"] - before["script"] == 1  # the release only
        status = lock.status()
        assert [h.token for h in status.holders] == [lease.token]
        left_on_store = status.holders[0].expires_at - status.now
        # Unclaimed: min(ttl, wait_ttl) on the store, counted locally from before the step
        # that put the waiter in line.
        wait_ttl = timing.blocking_wait_ttl(30)
        assert left_on_store <= wait_ttl
        assert lease.remaining <= left_on_store + 0.05
        # A third of the way into the short lease the renewer claims it for the full ttl.
        claimed_by = time.monotonic() + wait_ttl
        while time.monotonic() < claimed_by:
            holders = lock.status().holders
            if holders and holders[0].expires_at - lock.status().now > wait_ttl + 1:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the handed grant was never claimed")
        assert lease.remaining > wait_ttl + 1
        assert lease.release() is True
    finally:
        client.close()
        waiter_client.close()


def test_a_wake_up_for_another_entry_is_not_taken_as_a_grant(server: RedisProcess) -> None:
    """A wake-up names the waiting entry its grant was made for: a waiter asking for another
    entry gets no grant from it and looks with a step instead; a payload that is not a grant
    wakes without one."""
    client = turnstile.connect(server.url + "?prefix=tt-stale:")
    try:
        backend = client.backend
        listener = backend.connection.listening()  # up before the step: nothing to re-check
        assert listener.up
        holder = client.lock("job", ttl=5).acquire(timeout=1)
        step = backend.acquire("job", "w", limit=1, ttl=5, wait_ttl=2, enqueue=True)
        assert step.grant is None and step.position == 0 and step.wait_id is not None
        waiter = backend.open_waiter("job", "w")
        holder.release()  # hands over to "w"
        assert waiter.wait(2) is True
        assert waiter.handed(step.wait_id + 1) is None
        handed = waiter.handed(step.wait_id)
        assert handed is not None and handed.holder == "w"
        assert waiter.handed(step.wait_id) is None  # taken once
        waiter.close()
        # The grant is on the store, unclaimed: a step finds and claims it.
        claimed = backend.acquire("job", "w", limit=1, ttl=5, wait_ttl=2, enqueue=True)
        assert claimed.grant is not None
        assert backend.release("job", "w", claimed.grant.token) is True
        # A payload that is no grant carries nothing (and is logged, not raised).
        base = backend._keys.get("job")[0]
        bare = backend.open_waiter("job", "w2")
        with server.admin() as admin:
            admin.publish(listener.channel, f"g x 1 2 3 {base}w2")
        assert bare.wait(5) is True
        assert bare.handed(3) is None
        bare.close()
        assert client.lock("job").status().holders == ()
    finally:
        client.close()


def test_url_options_reach_the_driver(server: RedisProcess) -> None:
    client = turnstile.connect(
        server.url + "?prefix=tt-opts:&client_name=turnstile-test&socket_timeout=3"
        "&socket_connect_timeout=2&health_check_interval=5&max_connections=20"
    )
    try:
        client.lock("x").acquire(timeout=1).release()
        with server.admin() as admin:
            names = [c.get("name") for c in admin.client_list()]
        assert "turnstile-test" in names
        assert client.characteristics.cross_host and client.characteristics.woken_by_store
        assert "no append-only file" in client.characteristics.description
    finally:
        client.close()
