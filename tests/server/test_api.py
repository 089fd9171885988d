"""API v1 against a real `turnstile serve` process on every backend row."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

import turnstile
from tests.server.conftest import Served

ODD_NAMES = [
    "order/42",
    "a/../b",
    "//double//slash",
    "100% done?x=1&y=2#frag",
    "sp ace",
    "quote'\"",
    "{brace}:colon",
    "emoji 🦄 ünïcode",
    "'; DROP TABLE leases; --",
    "%2F%00encoded",
    "\\back\\slash",
]


def _acquire(api: Any, name: str, holder: str, **extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = api.ok("/v1/locks/acquire", {"name": name, "holder": holder, **extra})
    return result


def test_lock_acquire_status_release(served: Served) -> None:
    api = served.api()
    got = _acquire(api, "order:1", "worker-1", ttl=10)
    lease = got["lease"]
    assert got["acquired"] is True
    assert lease["holder"] == "worker-1" and lease["name"] == "order:1"
    assert 9 < lease["expires_in"] <= 10
    assert lease["expires_at"] - lease["acquired_at"] == pytest.approx(10, abs=0.01)

    # A second holder cannot have it at once; the failed attempt leaves no waiter behind.
    busy = api.post("/v1/locks/acquire", {"name": "order:1", "holder": "worker-2", "wait": 0})
    api.error(busy, 409, "acquire_timeout")
    status = api.ok("/v1/locks/status", {"name": "order:1"})
    assert [h["holder"] for h in status["holders"]] == ["worker-1"]
    assert status["holders"][0]["token"] == lease["token"]
    assert status["waiters"] == [] and status["limit"] == 1
    assert api.ok("/v1/names")["names"] == ["order:1"]

    # Release by holder and token, from "another process" (another connection).
    other = served.api()
    assert other.ok("/v1/locks/release", {"name": "order:1", "holder": "worker-1",
                                          "token": lease["token"]}) == {"released": True}
    assert other.ok("/v1/locks/release", {"name": "order:1", "holder": "worker-1"}) == {
        "released": False
    }
    again = _acquire(api, "order:1", "worker-2")
    assert again["lease"]["token"] > lease["token"]
    other.close()
    api.close()


def test_try_acquire_tickets_keep_their_place(served: Served) -> None:
    api = served.api()
    body = {"name": "sem", "limit": 2, "ttl": 10}
    first = [api.ok("/v1/semaphores/try-acquire", {**body, "holder": f"e{i}"}) for i in range(4)]
    assert [t["acquired"] for t in first] == [True, True, False, False]
    assert [t["position"] for t in first] == [None, None, 0, 1]
    assert first[2]["lease"] is None and first[2]["retry_after"] > 0
    # Idempotent: asking again keeps the place, and a holder gets the same lease back.
    assert api.ok("/v1/semaphores/try-acquire", {**body, "holder": "e3"})["position"] == 1
    again = api.ok("/v1/semaphores/try-acquire", {**body, "holder": "e0"})
    assert again["lease"]["token"] == first[0]["lease"]["token"]
    # A release hands the slot to the front of the line.
    assert api.ok("/v1/semaphores/release", {"name": "sem", "holder": "e0"})["released"]
    granted = api.ok("/v1/semaphores/try-acquire", {**body, "holder": "e2"})
    assert granted["acquired"] and granted["lease"]["token"] > first[1]["lease"]["token"]
    assert api.ok("/v1/semaphores/try-acquire", {**body, "holder": "e3"})["position"] == 0
    status = api.ok("/v1/semaphores/status", {"name": "sem"})
    assert status["limit"] == 2
    assert sorted(h["holder"] for h in status["holders"]) == ["e1", "e2"]
    assert [w["holder"] for w in status["waiters"]] == ["e3"]
    # Leaving the line by holder (no token).
    assert api.ok("/v1/semaphores/release", {"name": "sem", "holder": "e3"})["released"]
    assert api.ok("/v1/semaphores/status", {"name": "sem"})["waiters"] == []
    # enqueue=false does not join the line.
    nowait = api.ok("/v1/semaphores/try-acquire", {**body, "holder": "e9", "enqueue": False})
    assert nowait == {**nowait, "acquired": False, "position": None}
    api.close()


def test_renew_and_lost_lease(served: Served) -> None:
    api = served.api()
    lease = _acquire(api, "renew-me", "h", ttl=5)["lease"]  # renewed well within it
    renewed = api.ok("/v1/locks/renew", {"name": "renew-me", "holder": "h",
                                         "token": lease["token"], "ttl": 60})
    assert renewed["lease"]["token"] == lease["token"]
    assert renewed["lease"]["expires_at"] > lease["expires_at"] + 50
    stale = {"name": "renew-me", "holder": "h", "token": lease["token"] + 1000, "ttl": 5}
    api.error(api.post("/v1/locks/renew", stale), 409, "lease_lost")

    short = _acquire(api, "expire-me", "h", ttl=0.3)["lease"]
    time.sleep(0.5)
    taken = _acquire(api, "expire-me", "other")["lease"]
    assert taken["token"] > short["token"]
    lost = api.post("/v1/locks/renew", {"name": "expire-me", "holder": "h",
                                        "token": short["token"], "ttl": 5})
    api.error(lost, 409, "lease_lost")
    # A stale release never releases the newer grant.
    assert not api.ok("/v1/locks/release", {"name": "expire-me", "holder": "h",
                                            "token": short["token"]})["released"]
    metrics = api.get("/metrics").text
    assert "turnstile_lost_leases_total 2" in metrics
    api.close()


def test_long_poll_acquire_is_handed_over_in_order(served: Served) -> None:
    api = served.api()
    first = _acquire(api, "line", "h0", ttl=120)["lease"]  # lasts the test
    results: dict[str, Any] = {}

    def wait_for(holder: str) -> None:
        with httpx.Client(base_url=served.server.base, timeout=60,
                          headers=api.http.headers) as mine:
            started = time.monotonic()
            response = mine.post("/v1/locks/acquire",
                                 json={"name": "line", "holder": holder, "wait": 10, "ttl": 60})
            results[holder] = (response.status_code, response.json(), time.monotonic() - started)

    threads = []
    for holder in ("h1", "h2"):
        thread = threading.Thread(target=wait_for, args=(holder,))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 30
        while holder not in [w["holder"] for w in
                             api.ok("/v1/locks/status", {"name": "line"})["waiters"]]:
            assert time.monotonic() < deadline, "waiter never showed up"
            time.sleep(0.02)
    assert [w["holder"] for w in api.ok("/v1/locks/status", {"name": "line"})["waiters"]] == [
        "h1", "h2"
    ]
    released_at = time.monotonic()
    api.ok("/v1/locks/release", {"name": "line", "holder": "h0", "token": first["token"]})
    threads[0].join(60)
    assert results["h1"][0] == 200, results
    assert results["h1"][1]["lease"]["token"] > first["token"]
    assert "h2" not in results  # still in line
    handed_in = time.monotonic() - released_at
    assert handed_in < 8.0  # woken by the hand-over, not by the end of its wait (10 s)
    api.ok("/v1/locks/release", {"name": "line", "holder": "h1"})
    threads[1].join(60)
    assert results["h2"][0] == 200
    assert results["h2"][1]["lease"]["token"] > results["h1"][1]["lease"]["token"]
    api.close()


def test_long_poll_timeout_and_disconnect_leave_the_line(served: Served) -> None:
    api = served.api()
    _acquire(api, "busy", "owner", ttl=120)  # lasts the test
    started = time.monotonic()
    late = api.post("/v1/locks/acquire", {"name": "busy", "holder": "late", "wait": 0.4})
    api.error(late, 409, "acquire_timeout")
    assert 0.35 < time.monotonic() - started < 30
    assert api.ok("/v1/locks/status", {"name": "busy"})["waiters"] == []

    # A client that gives up (closes the connection) leaves the line too.
    gone = httpx.Client(base_url=served.server.base, headers=api.http.headers,
                        timeout=httpx.Timeout(30, read=0.5))
    with pytest.raises(httpx.ReadTimeout):
        gone.post("/v1/locks/acquire", json={"name": "busy", "holder": "quitter", "wait": 9})
    gone.close()
    deadline = time.monotonic() + 30
    while api.ok("/v1/locks/status", {"name": "busy"})["waiters"]:
        assert time.monotonic() < deadline, "the disconnected waiter stayed in line"
        time.sleep(0.05)
    api.close()


def test_odd_names_work_and_stay_separate(served: Served) -> None:
    api = served.api()
    for name in ODD_NAMES:
        lease = _acquire(api, name, "h")["lease"]
        assert lease["name"] == name
        by_get = api.get("/v1/locks/status", params={"name": name})
        assert by_get.status_code == 200 and by_get.json()["holders"][0]["holder"] == "h"
        assert by_get.json()["name"] == name
        # A neighbour name is a different lock.
        assert _acquire(api, name + "x", "h2")["acquired"]
    everything = sorted(ODD_NAMES + [n + "x" for n in ODD_NAMES])
    assert api.ok("/v1/names") == {"names": everything, "truncated": False}
    first = api.get("/v1/names", params={"max_count": 1}).json()
    assert first == {"names": everything[:1], "truncated": True}
    for name in ODD_NAMES:
        assert api.ok("/v1/locks/release", {"name": name, "holder": "h"})["released"]
        assert api.ok("/v1/locks/status", {"name": name})["holders"] == []
        assert api.ok("/v1/locks/status", {"name": name + "x"})["holders"][0]["holder"] == "h2"
    api.close()


def test_python_client_over_http(served: Served) -> None:
    """The Python client against the service: blocking FIFO acquire, status, tickets."""
    client = turnstile.connect(served.url("writer"))
    try:
        assert client.characteristics.scheme == "http"
        lock = client.lock("py:order", ttl=60)
        order: list[str] = []
        held = lock.acquire(timeout=5, holder="first")

        def worker(holder: str) -> None:
            with lock.acquire(timeout=10, holder=holder):
                order.append(holder)

        threads = []
        for holder in ("w1", "w2", "w3"):
            thread = threading.Thread(target=worker, args=(holder,))
            thread.start()
            threads.append(thread)
            deadline = time.monotonic() + 30
            while holder not in [w.holder for w in lock.status().waiters]:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        held.release()
        for thread in threads:
            thread.join(60)
        assert order == ["w1", "w2", "w3"]
        sem = client.semaphore("py:sem", 1, ttl=5)
        assert sem.try_acquire("x").acquired
        ticket = sem.try_acquire("y")
        assert not ticket.acquired and ticket.position == 0
        assert sem.release("x")
        assert sem.try_acquire("y").acquired
        assert client.names("py:") == ["py:sem"]
    finally:
        client.close()


def test_healthz_info_and_metrics(served: Served) -> None:
    anonymous = served.api(None)
    health = anonymous.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    api = served.api()
    info = api.ok("/v1/info")
    assert info["service"] == "turnstile" and info["api"] == "v1"
    assert info["limits"]["max_wait"] == 10
    assert info["principal"] == {"name": "admin", "prefixes": [""], "read_only": False,
                                 "admin": True}
    _acquire(api, "m", "h")
    api.ok("/v1/locks/release", {"name": "m", "holder": "h"})
    metrics = api.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert "turnstile_grants_total 1" in text
    assert "turnstile_releases_total 1" in text
    assert 'turnstile_wait_seconds_bucket{le="+Inf"} 1' in text
    assert "# TYPE turnstile_handover_seconds histogram" in text
    anonymous.close()
    api.close()
