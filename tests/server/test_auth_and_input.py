"""Access control, bad JSON, huge bodies: against one real server over SQLite."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

import turnstile
from tests.server.conftest import Api, Served


@pytest.fixture
def admin(sqlite_served: Served) -> Iterator[Api]:
    api = sqlite_served.api("admin")
    yield api
    # Leave nothing behind for the module's next test.
    for name in api.ok("/v1/names")["names"]:
        api.ok("/v1/admin/force-release", {"name": name})
    api.close()


WRITES = [
    ("/v1/locks/acquire", {"name": "{n}", "holder": "h"}),
    ("/v1/locks/try-acquire", {"name": "{n}", "holder": "h"}),
    ("/v1/semaphores/try-acquire", {"name": "{n}", "holder": "h", "limit": 2}),
    ("/v1/locks/renew", {"name": "{n}", "holder": "h", "token": 5, "ttl": 5}),
    ("/v1/locks/release", {"name": "{n}", "holder": "h"}),
    ("/v1/semaphores/wait", {"name": "{n}", "holder": "h", "timeout": 0}),
]


def _body(template: dict[str, object], name: str) -> dict[str, object]:
    return {k: (name if v == "{n}" else v) for k, v in template.items()}


def test_no_token_and_wrong_token_are_refused(sqlite_served: Served, admin: Api) -> None:
    for token in (None, "not-a-configured-token-at-all"):
        api = sqlite_served.api(token)
        for path, body in WRITES:
            response = api.post(path, _body(body, "a:x"))
            api.error(response, 401, "unauthorized")
            assert response.headers["www-authenticate"].startswith("Bearer")
        for path in ("/v1/names", "/v1/info", "/v1/dashboard", "/metrics",
                     "/v1/locks/status?name=a:x"):
            api.error(api.get(path), 401, "unauthorized")
        api.close()
    # Not a bearer scheme at all.
    raw = httpx.get(sqlite_served.server.base + "/v1/names",
                    headers={"Authorization": f"Basic {sqlite_served.server.tokens['admin']}"})
    assert raw.status_code == 401
    # Health, the schema and the dashboard page itself need no token.
    anonymous = sqlite_served.api(None)
    assert anonymous.get("/healthz").status_code == 200
    assert anonymous.get("/openapi.json").json()["openapi"].startswith("3.")
    page = anonymous.get("/")
    assert page.status_code == 200 and "<title>Turnstile</title>" in page.text
    anonymous.close()


def test_tenants_cannot_see_or_touch_each_others_names(sqlite_served: Served, admin: Api) -> None:
    a = sqlite_served.api("tenant-a")
    b = sqlite_served.api("tenant-b")
    lease = a.ok("/v1/locks/acquire", {"name": "a:order", "holder": "ha"})["lease"]
    b.ok("/v1/locks/acquire", {"name": "b:order", "holder": "hb"})
    admin.ok("/v1/locks/acquire", {"name": "zz:other", "holder": "hz"})

    for path, body in WRITES:
        message = b.error(b.post(path, _body(body, "a:order")), 403, "forbidden")
        assert "b:" in message
    b.error(b.post("/v1/locks/status", {"name": "a:order"}), 403, "forbidden")
    b.error(b.get("/v1/locks/status", params={"name": "a:order"}), 403, "forbidden")
    # b cannot release a's holder, even knowing holder and token.
    b.error(b.post("/v1/locks/release", {"name": "a:order", "holder": "ha",
                                         "token": lease["token"]}), 403, "forbidden")
    assert a.ok("/v1/locks/status", {"name": "a:order"})["holders"][0]["holder"] == "ha"

    # Listings show each tenant its own names only, whatever prefix it asks for.
    assert a.ok("/v1/names")["names"] == ["a:order"]
    assert b.ok("/v1/names")["names"] == ["b:order"]
    assert b.get("/v1/names", params={"prefix": "a:"}).json()["names"] == []
    assert b.get("/v1/names", params={"prefix": "b:o"}).json()["names"] == ["b:order"]
    assert admin.ok("/v1/names")["names"] == ["a:order", "b:order", "zz:other"]
    # So do the dashboard data and its events.
    dash = b.ok("/v1/dashboard")
    assert [n["name"] for n in dash["names"]] == ["b:order"]
    assert {e["name"] for e in dash["events"]} <= {"b:order"}
    assert dash["events"], "b's own grant is an event b may see"
    # The Python client with a tenant token gets AccessDenied.
    client = turnstile.connect(sqlite_served.url("tenant-b"))
    try:
        with pytest.raises(turnstile.AccessDenied):
            client.lock("a:order").try_acquire("x")
        assert client.names() == ["b:order"]
    finally:
        client.close()
    a.close()
    b.close()


def test_read_only_token_reads_but_never_writes(sqlite_served: Served, admin: Api) -> None:
    writer = sqlite_served.api("tenant-a")
    reader = sqlite_served.api("reader-a")
    writer.ok("/v1/locks/acquire", {"name": "a:ro", "holder": "h"})
    for path, body in WRITES:
        reader.error(reader.post(path, _body(body, "a:ro")), 403, "read_only")
    assert reader.ok("/v1/locks/status", {"name": "a:ro"})["holders"][0]["holder"] == "h"
    assert reader.ok("/v1/names")["names"] == ["a:ro"]
    # Outside its prefixes, "forbidden" comes first.
    reader.error(reader.post("/v1/locks/status", {"name": "b:x"}), 403, "forbidden")
    reader.close()
    writer.close()


def test_admin_actions_need_an_admin_token(sqlite_served: Served, admin: Api) -> None:
    tenant = sqlite_served.api("tenant-a")
    tenant.ok("/v1/locks/acquire", {"name": "a:stuck", "holder": "crashed"})
    tenant.ok("/v1/locks/try-acquire", {"name": "a:stuck", "holder": "next"})
    tenant.error(tenant.post("/v1/admin/force-release", {"name": "a:stuck"}), 403,
                 "admin_required")
    # Writing by name is not enough: an admin outside the prefix is "forbidden" first.
    other = sqlite_served.api("tenant-b")
    other.error(other.post("/v1/admin/force-release", {"name": "a:stuck"}), 403, "forbidden")
    released = admin.ok("/v1/admin/force-release", {"name": "a:stuck", "holder": "crashed"})
    assert released == {"released": ["crashed"]}
    status = admin.ok("/v1/locks/status", {"name": "a:stuck"})
    assert [h["holder"] for h in status["holders"]] == ["next"]
    assert admin.ok("/v1/admin/force-release", {"name": "a:stuck"}) == {"released": ["next"]}
    events = admin.ok("/v1/dashboard")["events"]
    forced = [e["holder"] for e in events if e["kind"] == "force_released" and
              e["name"] == "a:stuck"]
    assert forced == ["crashed", "next"]
    tenant.close()
    other.close()


def test_bad_json_and_bad_arguments(sqlite_served: Served, admin: Api) -> None:
    post = admin.http.post
    json_headers = {"content-type": "application/json"}
    for raw in (b"{", b"", b"nul", b'{"name": NaN}', b'{"name": "x", "ttl": Infinity}',
                b"\xff\xfe", b'{"token": ' + b"9" * 5000 + b"}"):
        admin.error(post("/v1/locks/acquire", content=raw, headers=json_headers), 400,
                    "bad_json")
    # Nesting beyond what the service reads is an argument out of range, not a crash.
    for raw in (b"[" * 100_000, b'{"name": ' + b"[" * 3000 + b"]" * 3000 + b"}"):
        message = admin.error(post("/v1/locks/acquire", content=raw, headers=json_headers),
                              422, "invalid_argument")
        assert "nest" in message
    for body in ([], "name", 5, None):
        message = admin.error(
            post("/v1/locks/acquire", content=json.dumps(body), headers=json_headers), 422,
            "invalid_argument",
        )
        assert "JSON object" in message
    admin.error(post("/v1/locks/acquire", content=b'{"name": "x"}',
                     headers={"content-type": "text/plain"}), 415, "unsupported_media_type")
    admin.error(post("/v1/locks/acquire", content=b'{"name": "x"}'), 415,
                "unsupported_media_type")
    cases = [
        ({"holder": "h"}, "name is required"),
        ({"name": "", "holder": "h"}, "name must not be empty"),
        ({"name": "x" * 4097}, "4096"),
        ({"name": "a\u0000b"}, "NUL"),
        ({"name": 5}, "name must be a string"),
        ({"name": "x", "ttl": 0}, "ttl must be between"),
        ({"name": "x", "ttl": -1}, "ttl must be between"),
        ({"name": "x", "ttl": "30"}, "ttl must be a number"),
        ({"name": "x", "ttl": True}, "ttl must be a number"),
        ({"name": "x", "wait": 11}, "wait must be between 0 and 10"),
        ({"name": "x", "wait": -1}, "wait must be between"),
        ({"name": "x", "holder": "h" * 1025}, "holder must be 1 to 1024"),
        ({"name": "x", "holder": ""}, "holder must be 1 to 1024"),
        ({"name": "x", "limit": 2}, "unknown field(s) 'limit'"),
        ({"name": "x", "surprise": 1}, "unknown field(s) 'surprise'"),
    ]
    for body, expected in cases:
        message = admin.error(admin.post("/v1/locks/acquire", body), 422, "invalid_argument")
        assert expected in message, (body, message)
    # 1e400 parses as infinity: refused as out of range, not as bad JSON.
    huge_ttl = post("/v1/locks/acquire", content=b'{"name": "x", "ttl": 1e400}',
                    headers=json_headers)
    assert "ttl must be between" in admin.error(huge_ttl, 422, "invalid_argument")
    for body, expected in [
        ({"name": "s", "holder": "h"}, "limit is required"),
        ({"name": "s", "holder": "h", "limit": 0}, "limit must be between 1"),
        ({"name": "s", "holder": "h", "limit": 1.5}, "limit must be an integer"),
        ({"name": "s", "limit": 2}, "holder is required"),
        ({"name": "s", "holder": "h", "limit": 2, "enqueue": "yes"}, "enqueue must be true"),
        ({"name": "s", "holder": "h", "limit": 2, "wait_ttl": 0}, "wait_ttl must be between"),
    ]:
        message = admin.error(admin.post("/v1/semaphores/try-acquire", body), 422,
                              "invalid_argument")
        assert expected in message, (body, message)
    for body, expected in [
        ({"name": "r", "holder": "h", "token": 0, "ttl": 5}, "token must be between 1"),
        ({"name": "r", "holder": "h", "token": "1", "ttl": 5}, "token must be an integer"),
        ({"name": "r", "holder": "h", "token": 2**63, "ttl": 5}, "token must be between 1"),
        ({"name": "r", "holder": "h", "token": 1}, "ttl is required"),
    ]:
        message = admin.error(admin.post("/v1/locks/renew", body), 422, "invalid_argument")
        assert expected in message, (body, message)
    admin.error(admin.get("/v1/names", params={"max_count": "many"}), 422, "invalid_argument")
    admin.error(admin.get("/v1/names", params={"max_count": "0"}), 422, "invalid_argument")
    admin.error(admin.get("/v1/locks/status"), 422, "invalid_argument")
    admin.error(admin.get("/v1/nothing-here"), 404, "not_found")
    admin.error(admin.get("/v1/locks/acquire"), 405, "method_not_allowed")
    # None of it left anything in the store.
    assert admin.ok("/v1/names")["names"] == []


def test_huge_bodies_are_refused(sqlite_served: Served, admin: Api) -> None:
    limit = admin.ok("/v1/info")["limits"]["max_body"]
    big = json.dumps({"name": "x", "holder": "h" * limit}).encode()
    headers = {"content-type": "application/json"}
    admin.error(admin.http.post("/v1/locks/acquire", content=big, headers=headers), 413,
                "payload_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while reading
        for _ in range(limit // 65536 + 2):
            yield b" " * 65536

    admin.error(admin.http.post("/v1/locks/acquire", content=chunks(), headers=headers), 413,
                "payload_too_large")
    # Just under the limit is read and served.
    padded = b'{"name": "x"}' + b" " * (limit - 20)
    ok = admin.http.post("/v1/locks/acquire", content=padded, headers=headers)
    assert ok.status_code == 200, ok.text
    # The service still answers.
    assert admin.get("/healthz").status_code == 200
