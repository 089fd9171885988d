"""SPEC guarantees 3 (leases), 6 (crash recovery) and 8 (lost leases are never silent):
a holder that dies is replaced within ttl + 1 s; a holder paused past its ttl is replaced by
a holder with a larger token and, once it runs again, learns that it lost."""

from __future__ import annotations

import signal
import time

import pytest

import turnstile
from tests.conftest import BackendUnderTest

from .lock_harness import Spawner, require_processes, wait_until

# A live holder renews every TTL / 3: it would have to stall for 2 s to lose its lease.
TTL = 3.0
BOUND = 1.0  # SPEC 6: the next waiter gets the grant within ttl plus at most this


@pytest.mark.slow
def test_killed_holder_is_replaced_within_ttl(
    backend: BackendUnderTest, client: turnstile.Client, workers: Spawner
) -> None:
    require_processes(backend, "kill -9 of the holding process")
    name = "crash:kill"
    holder = workers.spawn("hold", label="holder", name=name, limit=1, ttl=TTL, holder="victim")
    held = holder.wait_for("holding")
    waiter = workers.spawn(
        "wait_grant", label="waiter", name=name, limit=1, ttl=TTL, holder="next", timeout=30
    )
    waiter.wait_for("ready")
    waiter.send("go")
    lock = client.lock(name, ttl=TTL)
    wait_until(lambda: [w.holder for w in lock.status().waiters] == ["next"], 30, what="in line")
    time.sleep(TTL)  # the victim keeps its lease by renewing: nobody is admitted meanwhile
    assert not waiter.all("granted")
    killed = time.monotonic()
    holder.signal(signal.SIGKILL)
    granted = waiter.wait_for("granted", timeout=TTL + BOUND + 30)
    assert granted["t"] > killed
    assert granted["t"] - killed <= TTL + BOUND, (
        f"admitted {granted['t'] - killed:.2f} s after the kill (ttl {TTL})"
    )
    assert granted["token"] > held["token"]
    waiter.join()


@pytest.mark.slow
def test_abandoned_lease_expires_after_ttl(client: turnstile.Client, workers: Spawner) -> None:
    """A lease nobody renews (its holder stopped running) lapses after its ttl on the store's
    clock, and the next waiter is admitted within ttl + 1 s — not before the ttl."""
    name = "crash:abandoned"
    lock = client.lock(name, ttl=TTL)
    waiter = workers.spawn(
        "wait_grant", label="waiter", name=name, limit=1, ttl=TTL, holder="next", timeout=30
    )
    waiter.wait_for("ready")
    asked = time.monotonic()
    abandoned = lock.acquire_nowait(holder="gone")  # never renewed, never released
    waiter.send("go")
    granted = waiter.wait_for("granted", timeout=TTL + BOUND + 30)
    assert TTL - 0.05 <= granted["t"] - asked <= TTL + BOUND, granted["t"] - asked
    assert granted["token"] > abandoned.token
    assert abandoned.lost
    waiter.join()


@pytest.mark.slow
def test_paused_holder_is_replaced_and_learns_it_lost(
    backend: BackendUnderTest, client: turnstile.Client, workers: Spawner
) -> None:
    require_processes(backend, "SIGSTOP of the holding process")
    name = "crash:pause"
    victim = workers.spawn("hold", label="victim", name=name, limit=1, ttl=TTL, holder="victim")
    held = victim.wait_for("holding")
    stopped = time.monotonic()
    victim.signal(signal.SIGSTOP)  # teardown sends SIGCONT should an assertion fail first
    lock = client.lock(name, ttl=TTL)
    with lock.acquire(timeout=TTL + BOUND + 30, holder="successor") as lease:
        took_over = time.monotonic()
        assert took_over - stopped <= TTL + BOUND
        assert lease.token > held["token"]
        victim.signal(signal.SIGCONT)
        victim.send("finish")
        finishing = victim.wait_for("finishing", timeout=30)
        exited = victim.wait_for("exit", timeout=30)
        # The paused holder found out: lease.lost inside the block, the on_lost callback, and
        # LeaseLost when its with block ended.
        assert finishing["lost"] is True
        assert exited["raised"] == "LeaseLost"
        # The callback runs in whichever thread noticed first: from the renewer, its event may
        # arrive after "exit".
        victim.wait_for("on_lost", timeout=30)
        # Its release on the way out did not touch the newer grant.
        st = lock.status()
        assert [(h.holder, h.token) for h in st.holders] == [("successor", lease.token)]
        assert not lease.lost
    victim.join()


def test_lost_lease_is_never_silent(client: turnstile.Client) -> None:
    """A lease not renewed past its ttl and taken over: ``lost`` is true, the callback ran,
    ``renew`` raises LeaseLost, its ``with`` block raises LeaseLost, and its release does
    not touch the new holder."""
    name = "crash:lost"
    called = []
    ttl = 2.0  # it is still held when acquire returns, however slow that was
    lock = client.lock(name, ttl=ttl, on_lost=called.append)
    stale = lock.acquire(timeout=5, holder="stale")
    assert not stale.lost
    time.sleep(ttl + 0.1)
    with client.lock(name, ttl=5).acquire(timeout=5, holder="new") as newer:
        assert newer.token > stale.token
        assert stale.lost
        assert called == [stale]
        with pytest.raises(turnstile.LeaseLost):
            stale.renew()
        with pytest.raises(turnstile.LeaseLost), stale:
            pass
        assert stale.release() is False
        assert [h.holder for h in lock.status().holders] == ["new"]
        assert not newer.lost


def test_renew_of_a_taken_over_lease_raises(client: turnstile.Client) -> None:
    """The store refuses the renewal (not just the local deadline)."""
    name = "crash:renew"
    stale = client.lock(name, ttl=0.2).acquire(timeout=5, holder="stale")
    time.sleep(0.3)
    newer = client.lock(name, ttl=120).acquire(timeout=5, holder="new")  # lasts the test
    stale._deadline = time.monotonic() + 100  # pretend our local clock did not notice
    with pytest.raises(turnstile.LeaseLost):
        stale.renew()
    assert stale.lost
    assert [(h.holder, h.token) for h in client.status(name).holders] == [("new", newer.token)]
    newer.release()


def test_renewal_keeps_the_lease(client: turnstile.Client) -> None:
    """SPEC 3: inside ``with`` the lease auto-renews; nobody else gets in for several ttls."""
    ttl = 3.0  # renewed every second: a renewal may be two seconds late before it is lost
    lock = client.lock("crash:renewing", ttl=ttl)
    with lock.acquire(timeout=5) as lease:
        first_expiry = lease.expires_at
        deadline = time.monotonic() + 60
        # until renewed a whole ttl past the first expiry
        while lease.expires_at < first_expiry + ttl and time.monotonic() < deadline:
            with pytest.raises(turnstile.AcquireTimeout):
                lock.acquire_nowait()
            time.sleep(ttl / 4)
        assert not lease.lost
        assert lease.expires_at >= first_expiry + ttl
        assert [h.token for h in lock.status().holders] == [lease.token]
    assert lock.status().holders == ()


def test_explicit_renew_extends_on_the_store(client: turnstile.Client) -> None:
    ttl = 2.0  # the renew comes well within it
    lock = client.lock("crash:renew-explicit", ttl=ttl)
    lease = lock.acquire(timeout=5)
    before = lock.status().holders[0].expires_at
    time.sleep(0.1)
    lease.renew(ttl=120.0)
    after = lock.status().holders[0]
    assert after.expires_at > before + 100
    assert after.expires_at == pytest.approx(lease.expires_at)
    time.sleep(ttl + 0.2)  # past the original ttl
    assert not lease.lost
    assert [h.token for h in lock.status().holders] == [lease.token]
    assert lease.release()


def test_expiry_is_reported_by_status(client: turnstile.Client) -> None:
    ttl = 2.0  # the status comes well within it
    lock = client.lock("crash:expiry", ttl=ttl)
    lease = lock.acquire(timeout=5)
    st = lock.status()
    assert st.holders[0].expires_at == pytest.approx(st.holders[0].acquired_at + ttl, abs=0.01)
    wait_until(lambda: not lock.status().holders, 30, what="lease expired")
    assert lease.lost
    # Nothing has purged the expired lease yet: the name is idle all the same, on every
    # store (the store shows no limit; the next acquire may name any limit).
    st = client.status("crash:expiry")
    assert (st.limit, st.holders, st.waiters) == (None, (), ())
    assert "crash:expiry" not in client.names("crash:")


def test_failing_on_lost_callback_is_contained(client: turnstile.Client) -> None:
    def boom(lease: object) -> None:
        raise RuntimeError("user callback failed")

    lock = client.lock("crash:callback", ttl=0.2, on_lost=boom)
    with pytest.raises(turnstile.LeaseLost), lock.acquire(timeout=5) as stale:
        stale._stop_renewing()  # stop renewing, as if this process had been paused
        time.sleep(0.3)
        assert stale.lost  # the failing callback was swallowed (and logged)
