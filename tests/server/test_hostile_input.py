"""Hostile input to a real service (issue 17, point 11): absurd numbers, deep nesting, nulls
where the document says integer, invalid UTF-8 in the query, methods, redirects, tokens."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import Api, Served
from turnstile._core.validate import MAX_PAYLOAD_DEPTH

HUGE = "1" + "0" * 400  # an integer of 401 digits: beyond any float

# A valid value for each field an endpoint may require (names inside tenant-a's "a:").
VALID: dict[str, Any] = {
    "name": "a:hostile", "holder": "h", "limit": 1, "token": 1, "ttl": 5, "timeout": 0,
    "queue": "a:hostile-q", "id": "m1", "receipt": "r1", "seconds": 5, "rate": 5,
    "receipts": ["r1"],
}


@pytest.fixture
def admin(sqlite_served: Served) -> Iterator[Api]:
    api = sqlite_served.api("admin")
    yield api
    for name in api.ok("/v1/names")["names"]:
        api.ok("/v1/admin/force-release", {"name": name})
    api.close()


def _numeric_fields(document: dict[str, Any]) -> list[tuple[str, str, str, list[str]]]:
    """(method, path, field, required fields) for every number or integer field."""
    found = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "post":
                schema = operation["requestBody"]["content"]["application/json"]["schema"]
                properties, required = schema["properties"], schema.get("required", [])
            else:
                parameters = operation.get("parameters", [])
                properties = {p["name"]: p["schema"] for p in parameters}
                required = [p["name"] for p in parameters if p.get("required")]
            for field, schema in properties.items():
                kinds = schema.get("type", [])
                kinds = [kinds] if isinstance(kinds, str) else kinds
                if {"number", "integer"} & set(kinds):
                    found.append((method, path, field, required))
    return found


def test_integers_of_400_digits_are_refused_on_every_endpoint(
    sqlite_served: Served, admin: Api
) -> None:
    document = admin.ok("/openapi.json")
    fields = _numeric_fields(document)
    named = {f for _, _, f, _ in fields}
    # Every field the security pass named is among them.
    assert {"ttl", "wait", "timeout", "delay", "dedup_window", "visibility_timeout",
            "seconds", "wait_ttl", "limit", "token", "max_attempts", "top_keys",
            "max_count", "since", "rate", "per", "burst"} <= named, named
    answers = []
    for method, path, field, required in fields:
        if method == "post":
            body = {k: VALID[k] for k in required if k != field}
            if path == "/v1/queues/put":
                body["payload"] = 1  # one of payload or payload_base64 is needed
            text = json.dumps(body)[:-1] + ("," if body else "") + f'"{field}": {HUGE}}}'
            response = admin.http.post(path, content=text,
                                       headers={"content-type": "application/json"})
            # and the negative one
            negative = admin.http.post(path, content=text.replace(HUGE, "-" + HUGE),
                                       headers={"content-type": "application/json"})
            pairs = [response, negative]
        else:
            params = {k: str(VALID[k]) for k in required if k != field}
            pairs = [admin.get(path, params={**params, field: HUGE})]
        for answer in pairs:
            answers.append((method, path, field, answer.status_code))
            message = admin.error(answer, 422, "invalid_argument")
            assert field in message, (path, field, message)
            assert HUGE not in message  # described, not echoed
    assert len(answers) >= 30, answers
    log = sqlite_served.server.output()
    assert "Traceback" not in log and "OverflowError" not in log, log[-3000:]


def test_nested_payloads_and_bodies_answer_422(admin: Api) -> None:
    deep: Any = "x"
    for _ in range(MAX_PAYLOAD_DEPTH + 1):
        deep = [deep]
    message = admin.error(admin.post("/v1/queues/put", {"queue": "a:deep", "payload": deep}),
                          422, "invalid_argument")
    assert "payload" in message and str(MAX_PAYLOAD_DEPTH) in message
    # At the limit it is stored and handed back as it was.
    fine: Any = "x"
    for _ in range(MAX_PAYLOAD_DEPTH):
        fine = [fine]
    admin.ok("/v1/queues/put", {"queue": "a:deep", "payload": fine})
    got = admin.ok("/v1/queues/get", {"queue": "a:deep", "wait": 0})
    assert got["message"]["payload"] == fine
    admin.ok("/v1/queues/ack", {"queue": "a:deep", "id": got["message"]["id"],
                                "receipt": got["message"]["receipt"]})
    raw = b'{"queue": "a:deep", "payload": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    response = admin.http.post("/v1/queues/put", content=raw,
                               headers={"content-type": "application/json"})
    assert "nest" in admin.error(response, 422, "invalid_argument")


def test_null_is_refused_where_the_document_says_integer(admin: Api) -> None:
    for path, body, field in [
        ("/v1/locks/release", {"name": "a:n", "holder": "h", "token": None}, "token"),
        ("/v1/locks/renew", {"name": "a:n", "holder": "h", "token": None, "ttl": 5}, "token"),
        ("/v1/queues/stats", {"queue": "a:q", "top_keys": None}, "top_keys"),
        ("/v1/queues/dead", {"queue": "a:q", "limit": None}, "limit"),
        ("/v1/locks/acquire", {"name": "a:n", "ttl": None}, "ttl"),
        ("/v1/semaphores/try-acquire",
         {"name": "a:n", "holder": "h", "limit": 1, "enqueue": None}, "enqueue"),
    ]:
        message = admin.error(admin.post(path, body), 422, "invalid_argument")
        assert field in message and "null" in message, (path, message)
    # Where the document allows null it still means "absent".
    document = admin.ok("/openapi.json")
    put = document["paths"]["/v1/queues/put"]["post"]["requestBody"]["content"]
    assert "null" in put["application/json"]["schema"]["properties"]["key"]["type"]
    assert admin.ok("/v1/queues/put", {"queue": "a:q", "payload": 1, "key": None,
                                       "dedup_id": None})["created"]
    admin.ok("/v1/admin/purge-dead", {"queue": "a:q", "ids": None})


def test_invalid_utf8_in_a_query_parameter_is_refused(sqlite_served: Served,
                                                      admin: Api) -> None:
    admin.ok("/v1/locks/try-acquire", {"name": "a:\ufffd", "holder": "h"})
    base = sqlite_served.server.base
    headers = dict(admin.http.headers)
    for query in ("name=a:%FF", "name=a%3A%C3", "prefix=%80", "na%FFme=a:x"):
        path = "/v1/locks/status" if "name" in query else "/v1/names"
        # httpx would re-encode the query; send it exactly as written.
        response = httpx.get(f"{base}{path}?{query}", headers=headers)
        message = admin.error(response, 422, "invalid_argument")
        assert "UTF-8" in message, message
    # Valid percent-encoded UTF-8 is read as sent.
    status = httpx.get(f"{base}/v1/locks/status?name=a%3A%EF%BF%BD", headers=headers)
    assert status.status_code == 200 and status.json()["holders"][0]["holder"] == "h"


def test_405_answers_carry_allow(admin: Api) -> None:
    for method, path, allowed in [
        ("GET", "/v1/locks/acquire", {"POST"}),
        ("DELETE", "/v1/locks/status", {"GET", "POST"}),
        ("POST", "/v1/names", {"GET"}),
        ("PUT", "/healthz", {"GET"}),
    ]:
        response = admin.http.request(method, path)
        admin.error(response, 405, "method_not_allowed")
        allow = {m.strip() for m in response.headers["allow"].split(",")}
        assert allowed <= allow <= allowed | {"HEAD"}, (path, allow)


def test_no_redirect_is_built_from_the_host_header(sqlite_served: Served, admin: Api) -> None:
    host, port = sqlite_served.server.base.removeprefix("http://").split(":")
    for path in ("/v1/info/", "/v1/names/", "/healthz/", "/metrics/"):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: evil.com\r\nAuthorization: "
                f"{admin.http.headers['authorization']}\r\nConnection: close\r\n\r\n".encode()
            )
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
        assert not re.match(r"HTTP/1\.1 30\d", head), head
        assert "evil.com" not in answer.decode("latin-1"), answer
        assert head.startswith("HTTP/1.1 404"), head


def test_token_prefixes_match_at_a_separator_only(tmp_path: Any) -> None:
    from tests.http_server import start_server

    server = start_server(
        f"sqlite:///{tmp_path}/t.db", tmp_path,
        tokens=[{"name": "admin", "admin": True}, {"name": "team1", "prefixes": ["team1"]},
                {"name": "team10", "prefixes": ["team10:"]}],
    )
    try:
        team1 = Api(server, "team1")
        team10 = Api(server, "team10")
        team10.ok("/v1/locks/try-acquire", {"name": "team10:job", "holder": "x"})
        # team1 reaches neither team10's names nor their listing.
        team1.error(team1.post("/v1/locks/status", {"name": "team10:job"}), 403, "forbidden")
        team1.error(team1.post("/v1/locks/release", {"name": "team10:job", "holder": "x"}),
                    403, "forbidden")
        assert team1.ok("/v1/names")["names"] == []
        # Its own names: the prefix itself and names continuing with a separator.
        for name in ("team1", "team1:a", "team1/b", "team1.c"):
            assert team1.ok("/v1/locks/try-acquire", {"name": name, "holder": "y"})["acquired"]
        assert team1.ok("/v1/names")["names"] == ["team1", "team1.c", "team1/b", "team1:a"]
        assert team10.ok("/v1/names")["names"] == ["team10:job"]
        team1.close()
        team10.close()
        # The loader said why "team1" is risky, and never showed a secret.
        log = server.output()
        assert "prefix 'team1' does not end with a separator" in log, log
        for secret in server.tokens.values():
            assert secret not in log
    finally:
        server.stop()


def test_token_file_refuses_non_ascii_secrets_and_warns_about_short_ones() -> None:
    from turnstile.errors import ConfigurationError
    from turnstile.server.auth import TokenTable

    for secret in ("pässwörd-" + "x" * 30, "x" * 31 + "\u00e9", " " + "x" * 40, "x" * 40 + "\n"):
        with pytest.raises(ConfigurationError, match="printable ASCII") as caught:
            TokenTable.from_document({"tokens": [{"name": "t", "secret": secret}]}, "f")
        assert secret.strip() not in str(caught.value)
    short = "s" * 20
    table = TokenTable.from_document(
        {"tokens": [{"name": "short", "secret": short}, {"name": "long", "secret": "L" * 43,
                                                         "prefixes": ["team1", "b:"]}]}, "f")
    warnings = "\n".join(table.warnings)
    assert "'short'" in warnings and "20 characters" in warnings
    assert "'long'" in warnings and "prefix 'team1'" in warnings and "'b:'" not in warnings
    assert short not in warnings and "L" * 43 not in warnings
    # A UTF-8 secret configured by digest matches the bytes a client sends.
    import hashlib

    utf8 = "clé-" + "k" * 40
    table = TokenTable.from_document(
        {"tokens": [{"name": "d", "sha256": hashlib.sha256(utf8.encode()).hexdigest()}]}, "f")
    as_received = utf8.encode().decode("latin-1")  # how a header value reaches the service
    found = table.authenticate(as_received)
    assert found is not None and found.name == "d"


def test_healthz_tells_only_an_authenticated_caller_about_the_store(tmp_path: Any) -> None:
    from tests.http_server import start_server
    from tests.stores.redis._tools import redis_process

    with redis_process(tmp_path / "redis") as srv:
        server = start_server(srv.url + "?prefix=tt-healthz:", tmp_path,
                              tokens=[{"name": "admin", "admin": True}])
        try:
            anonymous = Api(server, None)
            admin = Api(server, "admin")
            assert anonymous.get("/healthz").status_code == 200
            srv.kill()
            down = anonymous.get("/healthz")
            assert down.status_code == 503 and down.headers["retry-after"] == "1"
            body = down.json()
            assert body == {"status": "unavailable", "error": {
                "code": "backend_unavailable", "message": "store unavailable"}}
            assert str(srv.port) not in down.text and "127.0.0.1" not in down.text
            # A wrong token is no token.
            wrong = Api(server, "x" * 40).get("/healthz")
            assert wrong.json()["error"]["message"] == "store unavailable"
            detailed = admin.get("/healthz")
            assert detailed.status_code == 503
            assert detailed.json()["error"]["message"] != "store unavailable"
            anonymous.close()
            admin.close()
        finally:
            server.stop()
