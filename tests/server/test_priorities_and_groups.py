"""Priorities and semaphore groups over HTTP (``priority``, ``ageing`` on the acquire and
try-acquire endpoints of locks, semaphores and rate limits; ``key`` and ``per_key`` on the
semaphore ones) against a real `turnstile serve` process, and bad values named."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.conftest import Served


def test_tickets_and_status_follow_priority(sqlite_served: Served) -> None:
    api = sqlite_served.api()
    spec: dict[str, Any] = {"name": "p:sem", "limit": 1, "ttl": 120}
    assert api.ok("/v1/semaphores/try-acquire", {**spec, "holder": "first"})["acquired"]
    asks = [("low", 0), ("high", 7), ("mid", 3), ("aged", 0)]
    positions = [
        api.ok("/v1/semaphores/try-acquire", {**spec, "holder": h, "priority": p})["position"]
        for h, p in asks
    ]
    assert positions == [0, 0, 1, 3]
    status = api.ok("/v1/semaphores/status", {"name": "p:sem"})
    assert [w["holder"] for w in status["waiters"]] == ["high", "mid", "low", "aged"]
    lock = {"name": "p:lock", "ttl": 120}
    api.ok("/v1/locks/try-acquire", {**lock, "holder": "first"})
    api.ok("/v1/locks/try-acquire", {**lock, "holder": "a", "ageing": True})
    ticket = api.ok("/v1/locks/try-acquire", {**lock, "holder": "b", "priority": 1, "ageing": 30})
    assert ticket["position"] == 0
    rate: dict[str, Any] = {"name": "p:rate", "rate": 1, "per": 600}
    assert api.ok("/v1/rates/try-acquire", {**rate, "holder": "first"})["acquired"]
    api.ok("/v1/rates/try-acquire", {**rate, "holder": "slow", "priority": -1})
    fast = api.ok("/v1/rates/try-acquire", {**rate, "holder": "fast", "ageing": False})
    assert fast["position"] == 0
    api.close()


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/v1/semaphores/try-acquire", {"limit": 2}),
        ("/v1/locks/try-acquire", {}),
        ("/v1/locks/acquire", {}),
        ("/v1/rates/try-acquire", {"rate": 5}),
        ("/v1/rates/acquire", {"rate": 5}),
    ],
)
@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"priority": 1001}, "priority must be between -1000 and 1000"),
        ({"priority": -10**30}, "priority must be between -1000 and 1000"),
        ({"priority": 1.5}, "priority must be an integer"),
        ({"priority": "1"}, "priority must be an integer"),
        ({"ageing": 0}, "ageing must be between 0.01 and"),
        ({"ageing": 10**12}, "ageing must be between 0.01 and"),
        ({"ageing": "10"}, "ageing must be"),
    ],
)
def test_bad_priorities_are_named(
    sqlite_served: Served, path: str, extra: dict[str, Any], body: dict[str, Any], words: str
) -> None:
    api = sqlite_served.api()
    response = api.post(path, {"name": "p:bad", "holder": "h", **extra, **body})
    assert words in api.error(response, 422, "invalid_argument")
    api.close()


def test_a_group_over_http(sqlite_served: Served) -> None:
    api = sqlite_served.api()
    spec: dict[str, Any] = {"name": "p:group", "limit": 2, "per_key": 1, "ttl": 120}
    first = api.ok("/v1/semaphores/try-acquire", {**spec, "key": "a", "holder": "a1"})
    assert first["acquired"]
    blocked = api.ok("/v1/semaphores/try-acquire", {**spec, "key": "a", "holder": "a2"})
    assert (blocked["acquired"], blocked["position"]) == (False, 0)
    other = api.ok("/v1/semaphores/acquire", {**spec, "key": "b", "holder": "b1"})
    assert other["acquired"]
    status = api.ok("/v1/semaphores/status", {"name": "p:group"})
    assert (status["limit"], status["per_key"]) == (2, 1)
    assert [(h["holder"], h["key"]) for h in status["holders"]] == [("a1", "a"), ("b1", "b")]
    assert [(w["holder"], w["key"]) for w in status["waiters"]] == [("a2", "a")]
    plain = api.post("/v1/semaphores/try-acquire", {"name": "p:group", "limit": 2, "holder": "x"})
    assert "semaphore group of per_key=1 total=2" in api.error(plain, 409, "limit_conflict")
    api.close()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"key": "a"}, "needs both key and per_key"),
        ({"per_key": 1}, "needs both key and per_key"),
        ({"key": "a", "per_key": 0}, "per_key must be"),
        ({"key": "", "per_key": 1}, "key must be"),
        ({"key": 5, "per_key": 1}, "key must be a string"),
    ],
)
def test_bad_group_fields_are_named(
    sqlite_served: Served, body: dict[str, Any], words: str
) -> None:
    api = sqlite_served.api()
    response = api.post("/v1/semaphores/try-acquire", {"name": "p:g", "limit": 2, "holder": "h",
                                                       **body})
    assert words in api.error(response, 422, "invalid_argument")
    api.close()


def test_a_semaphore_with_a_start_rate_over_http(sqlite_served: Served) -> None:
    api = sqlite_served.api()
    spec: dict[str, Any] = {"name": "p:rated", "limit": 3, "rate": 1, "per": 600, "ttl": 120}
    assert api.ok("/v1/semaphores/try-acquire", {**spec, "holder": "a"})["acquired"]
    # A free slot, but the next start is ten minutes away: the slot is held meanwhile.
    waiting = api.ok("/v1/semaphores/try-acquire", {**spec, "holder": "b"})
    assert (waiting["acquired"], waiting["position"]) == (False, 0)
    assert 500 < waiting["retry_after"] <= 600
    holders = api.ok("/v1/semaphores/status", {"name": "p:rated"})["holders"]
    assert sorted(h["holder"] for h in holders) == ["a", "b"]
    late = api.post("/v1/semaphores/acquire", {**spec, "holder": "c", "wait": 1})
    assert "past the timeout" in api.error(late, 409, "acquire_timeout")
    holders = api.ok("/v1/semaphores/status", {"name": "p:rated"})["holders"]
    assert sorted(h["holder"] for h in holders) == ["a", "b"]  # c gave its slot back
    rates = api.ok("/v1/rates/status", {"name": "p:rated"})
    assert [w["holder"] for w in rates["waiters"]] == ["b"]
    api.close()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"per": 5}, "per and burst go with rate"),
        ({"rate": 0}, "rate must be between 1"),
        ({"rate": 1, "key": "k", "per_key": 1}, "a semaphore group takes no rate"),
        ({"burst": 10**7, "key": "k", "per_key": 1}, "a semaphore group takes no rate"),
        ({"rate": 1, "callback": {"kind": "sfn", "task_token": "t0ken"}},
         "takes no callback"),
    ],
)
def test_bad_start_rates_are_named(
    sqlite_served: Served, body: dict[str, Any], words: str
) -> None:
    api = sqlite_served.api()
    response = api.post("/v1/semaphores/try-acquire", {"name": "p:r", "limit": 2, "holder": "h",
                                                       **body})
    assert words in api.error(response, 422, "invalid_argument")
    api.close()
