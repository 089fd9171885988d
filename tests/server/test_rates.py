"""Rate limit endpoints (``/v1/rates/*``) against a real `turnstile serve` process: the
ticket and the long poll, leaving the line, status, and the errors (conflict, bad arguments
named, tokens)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.contract.lock_harness import wait_until
from tests.server.conftest import Api, Served


def waiters(api: Api, name: str) -> list[str]:
    status = api.ok("/v1/rates/status", {"name": name})
    return [w["holder"] for w in status["waiters"]]


def test_try_acquire_answers_a_ticket_and_status_shows_the_line(sqlite_served: Served) -> None:
    api = sqlite_served.api()
    # One slot a minute once the burst is spent: a loaded machine cannot reach a slot.
    spec: dict[str, Any] = {"name": "r:ticket", "rate": 10, "per": 600, "burst": 2}
    tickets = [api.ok("/v1/rates/try-acquire", {**spec, "holder": f"h{i}"}) for i in range(4)]
    assert [t["acquired"] for t in tickets] == [True, True, False, False]
    assert [t["position"] for t in tickets] == [None, None, 0, 1]
    assert tickets[0]["retry_after"] == 0
    assert 0 < tickets[2]["retry_after"] < tickets[3]["retry_after"] <= 120
    assert tickets[3]["retry_after"] - tickets[2]["retry_after"] == pytest.approx(60, abs=1)
    # Asking again keeps the place.
    again = api.ok("/v1/rates/try-acquire", {**spec, "holder": "h2"})
    assert (again["acquired"], again["position"]) == (False, 0)
    # Without joining: not admitted, no place.
    passing = api.ok("/v1/rates/try-acquire", {**spec, "holder": "x", "enqueue": False})
    assert (passing["acquired"], passing["position"]) == (False, None)
    status = api.ok("/v1/rates/status", {"name": "r:ticket"})
    assert (status["rate"], status["per"], status["burst"]) == (10, 600.0, 2)
    assert [w["holder"] for w in status["waiters"]] == ["h2", "h3"]
    assert [w["position"] for w in status["waiters"]] == [0, 1]
    assert len(status["admitted"]) == 2
    by_get = api.get("/v1/rates/status", params={"name": "r:ticket"})
    assert by_get.status_code == 200 and by_get.json()["name"] == "r:ticket"
    assert api.ok("/v1/rates/leave", {"name": "r:ticket", "holder": "h2"}) == {"left": True}
    assert api.ok("/v1/rates/leave", {"name": "r:ticket", "holder": "h2"}) == {"left": False}
    assert waiters(api, "r:ticket") == ["h3"]
    idle = api.ok("/v1/rates/status", {"name": "r:never"})
    assert (idle["rate"], idle["per"], idle["burst"], idle["waiters"]) == (None, None, None, [])
    api.close()


def test_acquire_waits_in_line_for_the_slot(sqlite_served: Served) -> None:
    api = sqlite_served.api()
    spec: dict[str, Any] = {"name": "r:poll", "rate": 5, "per": 1}
    first = api.ok("/v1/rates/acquire", {**spec, "holder": "a"})
    assert first["admitted"] and first["holder"] == "a"
    started = time.monotonic()
    second = api.ok("/v1/rates/acquire", {**spec, "wait": 5})
    assert second["admitted"] and second["holder"].startswith("http/")
    # One emission interval (0.2 s) after the first, by the store's clock.
    assert second["now"] - first["now"] == pytest.approx(0.2, abs=0.1)
    assert time.monotonic() - started < 3
    api.close()


def test_acquire_times_out_at_once_and_leaves_the_line(sqlite_served: Served) -> None:
    api = sqlite_served.api()
    spec: dict[str, Any] = {"name": "r:slow", "rate": 1, "per": 60}
    assert api.ok("/v1/rates/try-acquire", {**spec, "holder": "a"})["acquired"]
    started = time.monotonic()
    message = api.error(
        api.post("/v1/rates/acquire", {**spec, "holder": "b", "wait": 2}), 409, "acquire_timeout"
    )
    assert "past the timeout" in message and "left the line" in message
    assert time.monotonic() - started < 2
    assert waiters(api, "r:slow") == []
    api.close()


def test_a_client_that_disconnects_leaves_the_line(sqlite_served: Served) -> None:
    api = sqlite_served.api()
    spec: dict[str, Any] = {"name": "r:gone", "rate": 1, "per": 8}
    assert api.ok("/v1/rates/try-acquire", {**spec, "holder": "a"})["acquired"]
    with pytest.raises(httpx.ReadTimeout):
        api.http.post("/v1/rates/acquire", json={**spec, "holder": "gone", "wait": 10},
                      timeout=1.0)
    wait_until(lambda: waiters(api, "r:gone") == [], 5, what="the abandoned waiter leaves")
    api.close()


def test_another_rate_on_a_busy_name_is_a_conflict(sqlite_served: Served) -> None:
    api = sqlite_served.api()
    spec: dict[str, Any] = {"name": "r:one", "rate": 5}
    api.ok("/v1/rates/try-acquire", {**spec, "holder": "a"})
    api.ok("/v1/rates/try-acquire", {**spec, "holder": "b"})
    message = api.error(
        api.post("/v1/rates/try-acquire", {**spec, "rate": 50, "holder": "c"}),
        409, "limit_conflict",
    )
    assert "rate=5 per=1 burst=1" in message
    api.close()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"rate": 0}, "rate must be between 1 and 1000000"),
        ({"rate": 10**7}, "rate must be between 1 and 1000000"),
        ({"rate": 1.5}, "rate must be an integer"),
        ({"rate": "5"}, "rate must be an integer"),
        ({"rate": 1, "per": 0}, "per must be between 0.001"),
        ({"rate": 1, "per": 10**8}, "per must be between"),
        ({"rate": 1, "burst": 0}, "burst must be between 1"),
        ({"rate": 1, "wait_ttl": 0}, "wait_ttl must be between"),
        ({}, "rate is required"),
    ],
)
def test_bad_arguments_are_named(
    sqlite_served: Served, body: dict[str, Any], words: str
) -> None:
    api = sqlite_served.api()
    response = api.post("/v1/rates/try-acquire", {"name": "r:bad", "holder": "h", **body})
    assert words in api.error(response, 422, "invalid_argument")
    too_long = api.post("/v1/rates/acquire", {"name": "r:bad", "rate": 1, "wait": 11})
    assert "wait must be between 0 and 10" in api.error(too_long, 422, "invalid_argument")
    api.close()


def test_tokens_keep_to_their_prefixes_and_read_only_tokens_only_read(
    sqlite_served: Served,
) -> None:
    spec: dict[str, Any] = {"rate": 5, "holder": "h"}
    tenant, reader, nobody = (
        sqlite_served.api("tenant-a"), sqlite_served.api("reader-a"), sqlite_served.api(None)
    )
    assert tenant.ok("/v1/rates/try-acquire", {**spec, "name": "a:rate"})["acquired"]
    for path in ("/v1/rates/try-acquire", "/v1/rates/acquire"):
        tenant.error(tenant.post(path, {**spec, "name": "b:rate"}), 403, "forbidden")
        reader.error(reader.post(path, {**spec, "name": "a:rate"}), 403, "read_only")
    reader.error(reader.post("/v1/rates/leave", {"name": "a:rate", "holder": "h"}),
                 403, "read_only")
    tenant.error(tenant.post("/v1/rates/status", {"name": "b:rate"}), 403, "forbidden")
    assert reader.ok("/v1/rates/status", {"name": "a:rate"})["rate"] == 5
    nobody.error(nobody.post("/v1/rates/status", {"name": "a:rate"}), 401, "unauthorized")
    for api in (tenant, reader, nobody):
        api.close()
