"""The one renewer per backend: every held lease of a client renewed by one thread (sync) or
one task per event loop (async), stopped on close, re-created in a forked child. Leases of
TTL = 3 s are renewed every second, so a renewal may come two seconds late on a loaded
machine; the tests wait until the store shows each renewal rather than sleep a fixed time
(docs/testing.md, rule 3)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

import turnstile
import turnstile.aio

pytestmark = pytest.mark.memory

TTL = 3.0


def _expiry(client: turnstile.Client, name: str) -> float:
    holders = client.status(name).holders
    assert len(holders) == 1, f"{name} is not held: {holders}"
    return holders[0].expires_at


def _wait_renewed(client: turnstile.Client, names: list[str], timeout: float = 30.0) -> None:
    """Until the store shows a renewal of each name's lease (its expiry moved on)."""
    first = {name: _expiry(client, name) for name in names}
    deadline = time.monotonic() + timeout
    for name in names:
        while _expiry(client, name) <= first[name]:
            assert time.monotonic() < deadline, f"{name} was never renewed"
            time.sleep(0.05)


def _renewer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "turnstile-renewer" and t.is_alive()]


def test_one_thread_renews_every_held_lease_until_close() -> None:
    client = turnstile.connect("memory://")
    before = len(_renewer_threads())
    names = [f"r{i}" for i in range(5)]
    leases = [client.lock(name, ttl=TTL).acquire(timeout=1) for name in names]
    for lease in leases:
        lease.__enter__()
    try:
        _wait_renewed(client, names)
        assert len(_renewer_threads()) == before + 1
        assert not any(lease.lost for lease in leases)
        for name, lease in zip(names, leases, strict=True):
            assert [h.token for h in client.status(name).holders] == [lease.token]
    finally:
        for lease in leases[1:]:
            lease.__exit__(None, None, None)
    # Released leases are no longer renewed; the one still held still is.
    _wait_renewed(client, names[:1])
    assert not leases[0].lost
    assert [bool(client.status(name).holders) for name in names] == [True] + [False] * 4
    client.close()
    assert len(_renewer_threads()) == before
    deadline = time.monotonic() + TTL + 30
    while not leases[0].lost:  # closing the client stopped renewing it: its ttl runs out
        assert time.monotonic() < deadline, "a lease of a closed client is still renewed"
        time.sleep(0.05)


def test_a_lease_not_renewed_is_lost_on_leaving_the_block() -> None:
    lost: list[object] = []
    with turnstile.connect("memory://") as client:
        lock = client.lock("r-lost", ttl=0.2, on_lost=lost.append)
        with pytest.raises(turnstile.LeaseLost), lock.acquire(timeout=1) as lease:
            lease._stop_renewing()
            time.sleep(0.3)  # past its ttl, on purpose: nothing renews it
        assert lost == [lease]
        # Another lease on the same client is still renewed.
        with client.lock("r-kept", ttl=TTL).acquire(timeout=1) as kept:
            _wait_renewed(client, ["r-kept"])
            assert not kept.lost


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_renewer() -> None:
    with turnstile.connect("memory://") as client:
        with client.lock("parent", ttl=TTL).acquire(timeout=1):  # parent's renewer running
            pid = os.fork()
            if pid == 0:  # child: the renewer thread did not survive the fork
                code = 1
                try:
                    with client.lock("child", ttl=TTL).acquire(timeout=1) as lease:
                        _wait_renewed(client, ["child"])
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
        leases = [await client.lock(f"a{i}", ttl=TTL).acquire(timeout=1) for i in range(4)]
        for lease in leases:
            await lease.__aenter__()
        first = [(await client.status(f"a{i}")).holders[0].expires_at for i in range(4)]
        deadline = time.monotonic() + 30
        for i in range(4):  # until the store shows each one renewed
            while (await client.status(f"a{i}")).holders[0].expires_at <= first[i]:
                assert time.monotonic() < deadline, f"a{i} was never renewed"
                await asyncio.sleep(0.05)
        assert len(renewer_tasks()) == 1
        assert not any(lease.lost for lease in leases)
        for lease in leases:
            await lease.__aexit__(None, None, None)
        await asyncio.sleep(0.05)
        assert renewer_tasks() == []
    finally:
        await client.close()
