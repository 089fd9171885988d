"""The endpoint table is the one description of the HTTP API: the app serves exactly the
operations its OpenAPI document lists, and every body field the document lists is accepted
(and nothing else is)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette", reason="pip install -e '.[server]'")
pytest.importorskip("httpx", reason="pip install -e '.[server]'")

from starlette.routing import Route

with warnings.catch_warnings():
    # Starlette's notice that a later release wants another HTTP client package: the one
    # installed works, and this test is about the app, not the client.
    warnings.filterwarnings("ignore", message=".*starlette.testclient.* is deprecated")
    from starlette.testclient import TestClient

from turnstile.server import ServerConfig, create_app

# Not operations of the API: the dashboard page and the document itself.
UNDOCUMENTED = {("/", "GET"), ("/openapi.json", "GET")}
# Values the primitives accept for fields that must be given together (a name, a holder, ...).
REQUIRED = {
    "name": "t:x", "queue": "t:q", "holder": "h", "limit": 2, "token": 1, "ttl": 5,
    "timeout": 0, "id": "i", "receipt": "r", "seconds": 5, "rate": 5, "receipts": ["r"],
    # /v1/events/stepfunctions: EventBridge's envelope
    "detail-type": "Step Functions Execution Status Change", "detail": {},
}


@pytest.fixture(scope="module")
def app_client() -> Iterator[TestClient]:
    app = create_app(ServerConfig(url="memory://", observe_interval=0, max_wait=1))
    # No tokens: the service answers requests addressed to a loopback host only.
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client


def _operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (path, method.upper())
        for path, item in document["paths"].items()
        for method in item
    }


def test_served_routes_are_the_documented_operations(app_client: TestClient) -> None:
    served = set()
    for route in app_client.app.routes:  # type: ignore[attr-defined]
        assert isinstance(route, Route)
        served |= {(route.path, m) for m in route.methods or () if m != "HEAD"}
    document = app_client.get("/openapi.json").json()
    assert served - UNDOCUMENTED == _operations(document)
    assert served >= UNDOCUMENTED


def _value(schema: dict[str, Any]) -> Any:
    """A value the schema documents as valid (its default, example or lowest bound)."""
    if "default" in schema:
        return schema["default"]
    if "examples" in schema:
        return schema["examples"][0]
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else [t for t in types if t != "null"]
    if not types:
        return 1  # any JSON value
    kind = types[0]
    if kind in ("number", "integer"):
        return max(schema.get("minimum", 1), 1)
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if schema.get("contentEncoding") == "base64":
        return "AAAA"
    return "x"


def test_every_documented_body_field_is_accepted(app_client: TestClient) -> None:
    document = app_client.get("/openapi.json").json()
    checked = 0
    for path, item in document["paths"].items():
        if "post" not in item:
            continue
        schema = item["post"]["requestBody"]["content"]["application/json"]["schema"]
        base = {f: REQUIRED[f] for f in schema["required"]}
        for field, field_schema in schema["properties"].items():
            body = {**base, field: REQUIRED.get(field, _value(field_schema))}
            response = app_client.post(path, json=body)
            message = response.json().get("error", {}).get("message", "")
            assert "unknown field" not in message, (path, field, message)
            assert response.status_code < 500, (path, field, response.text)
            checked += 1
        refused = app_client.post(path, json={**base, "surprise": 1})
        assert refused.status_code == 422, (path, refused.text)
        assert "unknown field(s) 'surprise'" in refused.json()["error"]["message"]
    assert checked >= 60


def test_every_documented_query_parameter_is_accepted(app_client: TestClient) -> None:
    document = app_client.get("/openapi.json").json()
    checked = 0
    for path, item in document["paths"].items():
        get = item.get("get")
        if get is None:
            continue
        params = get.get("parameters", [])
        base = {p["name"]: REQUIRED[p["name"]] for p in params if p["required"]}
        for param in params:
            query = {**base, param["name"]: REQUIRED.get(param["name"], _value(param["schema"]))}
            response = app_client.get(path, params=query)
            assert response.status_code == 200, (path, query, response.text)
            checked += 1
        refused = app_client.get(path, params={**base, "surprise": "1"})
        if get.get("security") == []:
            continue  # a probe answers whatever its query says
        assert refused.status_code == 422, (path, refused.text)
        assert "unknown query parameter(s) 'surprise'" in refused.json()["error"]["message"]
    assert checked >= 10
