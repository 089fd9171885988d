"""A Redis Cluster of the test's own, resharded under a blocked waiter (the name's keys move
to another master while one process holds the lock and another waits for it), and
restarted whole under a blocked waiter."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from redis.crc import key_slot

import turnstile
from scripts import servers
from turnstile.stores.redis import keys as redis_keys

from ._tools import RedisProcess, move_slot, redis_cluster, wait_until

pytestmark = [pytest.mark.redis_cluster, pytest.mark.slow]


def test_waiter_follows_its_name_to_another_master(tmp_path: Path) -> None:
    with redis_cluster(tmp_path) as nodes:
        url = f"redis+cluster://127.0.0.1:{nodes[0].port}?prefix=tt-reshard:"
        client = turnstile.connect(url)
        waiter_client = turnstile.connect(url)
        try:
            lock = client.lock("order:{7}", ttl=10)
            holder = lock.acquire(timeout=2)
            got: dict[str, float | int] = {}

            def wait() -> None:
                lease = waiter_client.lock("order:{7}", ttl=10).acquire(timeout=20)
                got["at"] = time.monotonic()
                got["token"] = lease.token
                lease.release()

            thread = threading.Thread(target=wait)
            thread.start()
            assert wait_until(lambda: bool(lock.status().waiters), 10)
            time.sleep(0.2)  # blocked in BLPOP on the old master

            slot = key_slot(redis_keys.key_base("tt-reshard:", "order:{7}").encode())
            source, target = move_slot(nodes, slot)
            assert source.port != target.port
            # The line survived the move: same holder, same waiter.
            status = lock.status()
            assert [h.token for h in status.holders] == [holder.token]
            assert len(status.waiters) == 1

            released_at = time.monotonic()
            assert holder.release()
            thread.join(20)
            assert not thread.is_alive()
            assert int(got["token"]) > holder.token
            # Woken on the new master (after one MOVED answer), not after its heartbeat.
            assert got["at"] - released_at < 1.5
            assert lock.status().holders == ()
        finally:
            client.close()
            waiter_client.close()


def test_blocked_waiter_resumes_after_the_whole_cluster_restarts(tmp_path: Path) -> None:
    """Issue 17.10 on a Cluster: every master killed (-9) under a waiter blocked in BLPOP and
    started again. The nodes keep no data (no append-only file), so the name is free when the
    cluster is back: the waiter's next step takes it at once, with a token above the lost
    holder's (tokens are at least the server clock), and the holder learns it lost."""
    cluster = servers.RedisClusterServers(3, tmp_path, node_class=RedisProcess)
    try:
        cluster.start()
        url = f"redis+cluster://127.0.0.1:{cluster.port}?prefix=tt-crestart:"
        client = turnstile.connect(url)
        waiter_client = turnstile.connect(url)
        try:
            lock = client.lock("order:{9}", ttl=30)
            holder = lock.acquire(timeout=5)
            got: dict[str, object] = {}

            def wait() -> None:
                try:
                    lease = waiter_client.lock("order:{9}", ttl=30).acquire(timeout=60)
                    got["at"] = time.monotonic()
                    got["token"] = lease.token
                    lease.release()
                except BaseException as exc:
                    got["error"] = exc

            thread = threading.Thread(target=wait)
            thread.start()
            assert wait_until(lambda: bool(lock.status().waiters), 10)
            time.sleep(0.2)  # blocked in BLPOP

            cluster.kill()
            time.sleep(0.5)
            cluster.start()  # returns once every node reports cluster_state:ok
            up = time.monotonic()
            thread.join(60)
            assert not thread.is_alive()
            assert "error" not in got, repr(got.get("error"))
            assert int(got["token"]) > holder.token  # type: ignore[call-overload]
            late = float(got["at"]) - up  # type: ignore[arg-type]
            assert late < 1.5, f"the waiter got its grant {late:.2f} s after the cluster was back"
            with pytest.raises(turnstile.LeaseLost):
                holder.renew()
        finally:
            client.close()
            waiter_client.close()
    finally:
        cluster.close()
