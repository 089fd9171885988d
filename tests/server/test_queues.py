"""Queue endpoints against a real `turnstile serve` process on every backend row."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import httpx
import pytest

import turnstile
from tests.conftest import BackendUnderTest
from tests.server.conftest import Api, Served


@pytest.fixture(autouse=True)
def _queues_supported(served: Served) -> None:
    """Queues join each backend as it gets them; a store without them answers 501."""
    api = served.api()
    backend = api.ok("/v1/info")["backend"]
    api.close()
    if not backend["queues"]:
        pytest.skip(f"the {served.backend} backend has no queues (yet)")


def put(api: Api, queue: str, payload: Any, **extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = api.ok("/v1/queues/put", {"queue": queue, "payload": payload,
                                                       **extra})
    return result


def get(api: Api, queue: str, **extra: Any) -> dict[str, Any] | None:
    message: dict[str, Any] | None = api.ok("/v1/queues/get", {"queue": queue, **extra})[
        "message"
    ]
    return message


def test_put_get_ack_in_key_order(served: Served) -> None:
    api = served.api()
    first = put(api, "q", {"order": 1, "event": "created"}, key="order-1")
    second = put(api, "q", {"order": 1, "event": "paid"}, key="order-1")
    other = put(api, "q", [1, 2, 3], key="order-2")
    assert first["created"] and first["id"] != second["id"]
    m1 = get(api, "q")
    assert m1 is not None and m1["id"] == first["id"]
    assert m1["payload"] == {"order": 1, "event": "created"} and m1["payload_base64"] is None
    assert m1["attempt"] == 1 and m1["key"] == "order-1"
    # order-1 has a message in flight: the next deliverable one is order-2's.
    m2 = get(api, "q")
    assert m2 is not None and m2["id"] == other["id"]
    assert get(api, "q") is None
    stats = api.ok("/v1/queues/stats", {"queue": "q"})
    assert (stats["ready"], stats["in_flight"], stats["dead"]) == (1, 2, 0)
    assert api.ok("/v1/queues/ack", {"queue": "q", "id": m1["id"], "receipt": m1["receipt"]}) == {
        "acked": True
    }
    assert not api.ok("/v1/queues/ack", {"queue": "q", "id": m1["id"],
                                         "receipt": m1["receipt"]})["acked"]
    m3 = get(api, "q")
    assert m3 is not None and m3["id"] == second["id"]
    by_get = api.get("/v1/queues/stats", params={"queue": "q", "top_keys": 1})
    assert by_get.status_code == 200 and by_get.json()["in_flight"] == 2
    assert api.ok("/v1/queues")["queues"] == ["q"]
    api.close()


def test_bytes_dedup_delay_nack_extend_and_dead_letters(served: Served) -> None:
    api = served.api()
    raw = bytes(range(256))
    put(api, "b", None)  # a JSON null payload is a payload
    sent = api.ok("/v1/queues/put", {"queue": "b", "payload_base64": base64.b64encode(raw)
                                     .decode(), "dedup_id": "d-1"})
    again = api.ok("/v1/queues/put", {"queue": "b", "payload_base64": "AAAA",
                                      "dedup_id": "d-1"})
    assert again == {**again, "id": sent["id"], "created": False}
    null = get(api, "b")
    assert null is not None and null["payload"] is None and null["payload_base64"] is None
    message = get(api, "b")
    assert message is not None and base64.b64decode(message["payload_base64"]) == raw
    extended = api.ok("/v1/queues/extend", {"queue": "b", "id": message["id"],
                                            "receipt": message["receipt"], "seconds": 60})
    assert extended["extended"] and extended["deadline"] > message["deadline"]
    # nack: delivered again, attempt 2; with max_attempts 2 the next nack dead-letters it.
    assert api.ok("/v1/queues/nack", {"queue": "b", "id": message["id"],
                                      "receipt": message["receipt"]})["nacked"]
    retry = get(api, "b", max_attempts=2)
    assert retry is not None and retry["id"] == message["id"] and retry["attempt"] == 2
    assert api.ok("/v1/queues/nack", {"queue": "b", "id": retry["id"],
                                      "receipt": retry["receipt"], "error": "boom"})["nacked"]
    dead = api.ok("/v1/queues/dead", {"queue": "b"})["dead_letters"]
    assert [(d["id"], d["attempts"], d["error"]) for d in dead] == [(message["id"], 2, "boom")]
    assert base64.b64decode(dead[0]["payload_base64"]) == raw
    assert api.get("/v1/queues/dead", params={"queue": "b", "limit": 1}).json() == {
        "dead_letters": dead
    }
    # A delayed message is not delivered before it is due.
    put(api, "d", "later", delay=3.0)  # the next get comes well within it
    assert get(api, "d") is None
    time.sleep(3.1)
    due = get(api, "d")
    assert due is not None and due["payload"] == "later"
    # Admin only: requeue and purge.
    tenant = served.api("writer")
    tenant.error(tenant.post("/v1/admin/requeue-dead", {"queue": "b"}), 403, "admin_required")
    assert api.ok("/v1/admin/requeue-dead", {"queue": "b"}) == {"requeued": 1}
    back = get(api, "b")
    assert back is not None and back["id"] == message["id"] and back["attempt"] == 1
    api.ok("/v1/queues/nack", {"queue": "b", "id": back["id"], "receipt": back["receipt"]})
    again_dead = get(api, "b", max_attempts=1)
    assert again_dead is not None
    api.ok("/v1/queues/nack", {"queue": "b", "id": again_dead["id"],
                               "receipt": again_dead["receipt"]})
    assert api.ok("/v1/admin/purge-dead", {"queue": "b", "ids": [message["id"]]}) == {
        "purged": 1
    }
    assert api.ok("/v1/queues/stats", {"queue": "b"})["dead"] == 0
    tenant.close()
    api.close()


def test_long_poll_get_is_woken_by_a_put(served: Served) -> None:
    api = served.api()
    got: dict[str, Any] = {}

    def consumer() -> None:
        with httpx.Client(base_url=served.server.base, headers=api.http.headers,
                          timeout=30) as mine:
            response = mine.post("/v1/queues/get", json={"queue": "w", "wait": 10})
            got["message"] = response.json()["message"]
            got["at"] = time.monotonic()

    thread = threading.Thread(target=consumer)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()
    sent_at = time.monotonic()
    put(api, "w", "wake up")
    thread.join(60)
    assert got["message"]["payload"] == "wake up"
    assert got["at"] - sent_at < 8.0  # woken by the store, not by the end of the wait (10 s)

    # A consumer that gives up (disconnects) takes nothing with it.
    gone = httpx.Client(base_url=served.server.base, headers=api.http.headers,
                        timeout=httpx.Timeout(30, read=0.5))
    with pytest.raises(httpx.ReadTimeout):
        gone.post("/v1/queues/get", json={"queue": "w2", "wait": 9})
    gone.close()
    time.sleep(0.3)
    put(api, "w2", "for the next one")
    message = get(api, "w2", wait=10)
    assert message is not None and message["attempt"] == 1
    api.close()


def test_queue_tenants_and_bad_input(served: Served) -> None:
    a = served.api("tenant-a")
    b = served.api("tenant-b")
    reader = served.api("reader-a")
    put(a, "a:jobs", 1)
    b.error(b.post("/v1/queues/put", {"queue": "a:jobs", "payload": 1}), 403, "forbidden")
    b.error(b.post("/v1/queues/get", {"queue": "a:jobs"}), 403, "forbidden")
    b.error(b.post("/v1/queues/stats", {"queue": "a:jobs"}), 403, "forbidden")
    reader.error(reader.post("/v1/queues/get", {"queue": "a:jobs"}), 403, "read_only")
    assert reader.ok("/v1/queues/stats", {"queue": "a:jobs"})["ready"] == 1
    put(b, "b:jobs", 2)
    assert a.ok("/v1/queues")["queues"] == ["a:jobs"]
    assert b.ok("/v1/queues")["queues"] == ["b:jobs"]
    assert [q["name"] for q in b.ok("/v1/dashboard")["queues"]] == ["b:jobs"]
    metrics = b.get("/metrics").text
    assert 'turnstile_queue_ready{queue="b:jobs"} 1' in metrics
    assert "a:jobs" not in metrics
    for body, expected in [
        ({"queue": "a:q"}, "exactly one of payload"),
        ({"queue": "a:q", "payload": 1, "payload_base64": "AAAA"}, "exactly one of payload"),
        ({"queue": "a:q", "payload_base64": "not base64!"}, "not valid base64"),
        ({"queue": "a:q", "payload": "x" * (256 * 1024)}, "256 KiB"),
        ({"queue": "a:q", "payload": 1, "key": "k" * 1025}, "key must be 1 to 1024"),
        ({"queue": "a:q", "payload": 1, "key": 5}, "key must be a string"),
        ({"queue": "a:q", "payload": 1, "delay": -1}, "delay must be between"),
        ({"queue": "a:q", "payload": 1, "max_attempts": 0}, "max_attempts must be between"),
        ({"queue": "a:q", "payload": 1, "extra": 0}, "unknown field(s) 'extra'"),
        ({"payload": 1}, "queue is required"),
    ]:
        message = a.error(a.post("/v1/queues/put", body), 422, "invalid_argument")
        assert expected in message, (body, message)
    for path, body, expected in [
        ("/v1/queues/get", {"queue": "a:q", "wait": 11}, "wait must be between 0 and 10"),
        ("/v1/queues/get", {"queue": "a:q", "visibility_timeout": 0}, "visibility_timeout"),
        ("/v1/queues/get", {"queue": "a:q", "concurrency": 0}, "concurrency must be between"),
        ("/v1/queues/ack", {"queue": "a:q", "id": "x"}, "receipt is required"),
        ("/v1/queues/extend", {"queue": "a:q", "id": "x", "receipt": "r", "seconds": 0},
         "seconds must be between"),
        ("/v1/queues/stats", {"queue": "a:q", "top_keys": 0}, "top_keys must be between"),
    ]:
        message = a.error(a.post(path, body), 422, "invalid_argument")
        assert expected in message, (path, body, message)
    for api in (a, b, reader):
        api.close()


def test_ack_claim_acks_and_claims_a_batch_in_one_request(served: Served) -> None:
    """/v1/queues/ack-claim: the acks, then one claim per receipt (distinct keys, oldest
    first), in one store step; nothing deliverable answers no message and a retry_after."""
    api = served.api()
    ids = [put(api, "batch", i, key=f"k{i % 2}")["id"] for i in range(3)]  # k0, k1, k0
    first = api.ok("/v1/queues/ack-claim", {"queue": "batch", "receipts": ["r1", "r2", "r3"]})
    assert first["acked"] == [] and first["retry_after"] is None
    got = first["messages"]
    # k0's second message waits for its first: two claimed, one per key, oldest first.
    assert [(m["id"], m["receipt"], m["payload"]) for m in got] == [
        (ids[0], "r1", 0), (ids[1], "r2", 1)
    ]
    acks = [{"id": m["id"], "receipt": m["receipt"]} for m in got]
    second = api.ok("/v1/queues/ack-claim", {"queue": "batch", "acks": acks, "receipts": ["r4"]})
    assert second["acked"] == [True, True]
    assert [(m["id"], m["receipt"]) for m in second["messages"]] == [(ids[2], "r4")]
    again = api.ok("/v1/queues/ack-claim", {
        "queue": "batch", "acks": [*acks, {"id": ids[2], "receipt": "r4"}], "receipts": ["r5"],
    })  # fmt: skip
    assert again["acked"] == [False, False, True] and again["messages"] == []
    stats = api.ok("/v1/queues/stats", {"queue": "batch"})
    assert (stats["ready"], stats["in_flight"], stats["delayed"]) == (0, 0, 0)
    for body, expected in [
        ({"queue": "batch"}, "receipts is required"),
        ({"queue": "batch", "receipts": []}, "receipts must be a list of 1 to 1000"),
        ({"queue": "batch", "receipts": ["r"] * 1001}, "receipts must be a list of 1 to 1000"),
        ({"queue": "batch", "receipts": ["r", "r"]}, "receipts must be distinct"),
        ({"queue": "batch", "receipts": [""]}, "receipts[0]"),
        ({"queue": "batch", "receipts": ["r"], "acks": [{"id": "x"}]},
         "acks[0] must be an object with exactly id and receipt"),
        ({"queue": "batch", "receipts": ["r"], "acks": [{"id": "x", "receipt": 5}]},
         "acks[0].receipt"),
        ({"queue": "batch", "receipts": ["r"], "acks": [{"id": "x", "receipt": "y"}] * 1001},
         "acks must be a list of at most 1000"),
    ]:
        message = api.error(api.post("/v1/queues/ack-claim", body), 422, "invalid_argument")
        assert expected in message, (body, message)
    reader = served.api("reader-a")
    reader.error(reader.post("/v1/queues/ack-claim", {"queue": "a:jobs", "receipts": ["r"]}),
                 403, "read_only")
    reader.close()
    api.close()


def test_the_client_acks_and_claims_a_prefetched_batch_in_one_request(served: Served) -> None:
    """work(prefetch=) over http://: one /v1/queues/ack-claim request per batch step (the acks
    of a batch and the claims of the next), not a request per ack and per claim."""
    with turnstile.connect(served.url()) as client:
        q = client.queue("prefetched")
        for i in range(6):
            q.put(i, key=f"k{i}")
        backend: Any = client.backend
        paths: list[str] = []
        call = backend.call

        def counting(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            paths.append(path)
            return call(method, path, *args, **kwargs)

        backend.call = counting
        seen: list[Any] = []
        result = q.work(seen.append, prefetch=3, max_messages=6, idle_timeout=5)
        assert result.acked == 6 and sorted(m.payload for m in seen) == list(range(6))
        # The first message by a long poll and the rest of its batch by one batch step;
        # the second batch claimed by the step that acks the first; the last batch's acks on
        # their own as the loop ends (max_messages).
        assert paths == [
            "/v1/queues/get", "/v1/queues/ack-claim", "/v1/queues/ack-claim",
            *["/v1/queues/ack"] * 3,
        ], paths


def test_a_service_without_the_batch_step_gets_a_request_per_ack_and_claim(
    served: Served,
) -> None:
    """A service of an earlier release answers 404 to /v1/queues/ack-claim: the client asks
    once, then acks and claims step by step; every message is handled once."""
    from turnstile.errors import NotSupported

    with turnstile.connect(served.url()) as client:
        q = client.queue("old-service")
        for i in range(6):
            q.put(i, key=f"k{i}")
        backend: Any = client.backend
        paths: list[str] = []
        call = backend.call

        def old_service(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            paths.append(path)
            if path == "/v1/queues/ack-claim":
                raise NotSupported("the Turnstile service cannot do this: not found")
            return call(method, path, *args, **kwargs)

        backend.call = old_service
        seen: list[Any] = []
        result = q.work(seen.append, prefetch=3, max_messages=6, idle_timeout=5)
        assert result.acked == 6 and sorted(m.payload for m in seen) == list(range(6))
        assert paths.count("/v1/queues/ack-claim") == 1, paths
        assert "/v1/queues/claim" in paths and "/v1/queues/ack" in paths, paths
        assert q.stats().in_flight == 0


def test_the_queue_list_comes_from_the_store(served: Served, backend: BackendUnderTest) -> None:
    """/v1/queues, the dashboard and /metrics show every queue that holds messages, also
    those filled by other processes straight in the store, never through this instance."""
    api = served.api()
    assert api.ok("/v1/queues") == {"queues": [], "truncated": False}
    expected = ["a:jobs", "b:jobs"]
    put(api, "a:jobs", 1)
    put(api, "b:jobs", 2)
    if served.backend != "memory":  # a memory store lives inside the server process only
        with turnstile.connect(backend.url) as elsewhere:
            elsewhere.queue("a:elsewhere").put({"from": "another process"})
        expected = ["a:elsewhere", *expected]
    assert api.ok("/v1/queues") == {"queues": expected, "truncated": False}
    first = api.get("/v1/queues", params={"max_count": 1})
    assert first.json() == {"queues": expected[:1], "truncated": True}
    only_b = api.get("/v1/queues", params={"prefix": "b:"})
    assert only_b.json() == {"queues": ["b:jobs"], "truncated": False}
    tenant = served.api("tenant-b")  # may read b: only, whatever prefix it asks for
    assert tenant.ok("/v1/queues") == {"queues": ["b:jobs"], "truncated": False}
    nothing = tenant.get("/v1/queues", params={"prefix": "a:"})
    assert nothing.json() == {"queues": [], "truncated": False}
    assert [q["name"] for q in api.ok("/v1/dashboard")["queues"]] == expected
    metrics = api.get("/metrics").text
    for name in expected:
        assert f'turnstile_queue_ready{{queue="{name}"}} 1' in metrics
    api.error(api.get("/v1/queues", params={"max_count": "0"}), 422, "invalid_argument")
    for impossible in ("q" * 4097, "a:\x00"):  # no name starts with it: nothing, no error
        answer = api.get("/v1/queues", params={"prefix": impossible})
        assert answer.json() == {"queues": [], "truncated": False}
    for client in (api, tenant):
        client.close()

