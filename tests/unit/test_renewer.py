"""The one renewer per backend: every held lease of a client renewed by one thread (sync) or
one task per event loop (async), stopped on close, re-created in a forked child. Renewals
every ttl/3 = 0.2 s leave 0.4 s of slack for a loaded machine."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

import turnstile
import turnstile.aio

pytestmark = pytest.mark.memory


def _renewer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "turnstile-renewer" and t.is_alive()]


def test_one_thread_renews_every_held_lease_until_close() -> None:
    client = turnstile.connect("memory://")
    before = len(_renewer_threads())
    leases = [client.lock(f"r{i}", ttl=0.6).acquire(timeout=1) for i in range(5)]
    for lease in leases:
        lease.__enter__()
    try:
        time.sleep(1.5)  # more than two ttls: only renewals keep them
        assert len(_renewer_threads()) == before + 1
        assert not any(lease.lost for lease in leases)
        for i, lease in enumerate(leases):
            holders = client.status(f"r{i}").holders
            assert [h.token for h in holders] == [lease.token]
    finally:
        for lease in leases[1:]:
            lease.__exit__(None, None, None)
    # Released leases are no longer renewed; the one still held still is.
    time.sleep(0.9)
    assert not leases[0].lost
    assert [bool(client.status(f"r{i}").holders) for i in range(5)] == [True] + [False] * 4
    client.close()
    assert len(_renewer_threads()) == before
    time.sleep(0.7)
    assert leases[0].lost  # closing the client stopped renewing it


def test_a_lease_not_renewed_is_lost_on_leaving_the_block() -> None:
    lost: list[object] = []
    with turnstile.connect("memory://") as client:
        lock = client.lock("r-lost", ttl=0.2, on_lost=lost.append)
        with pytest.raises(turnstile.LeaseLost), lock.acquire(timeout=1) as lease:
            lease._stop_renewing()
            time.sleep(0.3)
        assert lost == [lease]
        # Another lease on the same client is still renewed.
        with client.lock("r-kept", ttl=0.6).acquire(timeout=1) as kept:
            time.sleep(1.0)
            assert not kept.lost


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_renewer() -> None:
    with turnstile.connect("memory://") as client:
        with client.lock("parent", ttl=0.6).acquire(timeout=1):  # parent's renewer running
            pid = os.fork()
            if pid == 0:  # child: the renewer thread did not survive the fork
                code = 1
                try:
                    with client.lock("child", ttl=0.6).acquire(timeout=1) as lease:
                        time.sleep(1.5)
                        code = 0 if not lease.lost else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


async def test_async_one_task_per_loop_ends_when_nothing_is_held() -> None:
    client = await turnstile.aio.connect("memory://")

    def renewer_tasks() -> list[asyncio.Task[object]]:
        return [
            t for t in asyncio.all_tasks() if t.get_name() == "turnstile-renewer" and not t.done()
        ]

    try:
        leases = [await client.lock(f"a{i}", ttl=0.6).acquire(timeout=1) for i in range(4)]
        for lease in leases:
            await lease.__aenter__()
        await asyncio.sleep(1.5)
        assert len(renewer_tasks()) == 1
        assert not any(lease.lost for lease in leases)
        for lease in leases:
            await lease.__aexit__(None, None, None)
        await asyncio.sleep(0.05)
        assert renewer_tasks() == []
    finally:
        await client.close()
