from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx", reason="pip install -e '.[server,http]'")
pytest.importorskip("starlette", reason="pip install -e '.[server,http]'")
pytest.importorskip("uvicorn", reason="pip install -e '.[server,http]'")

from tests.conftest import BackendUnderTest  # noqa: E402
from tests.http_server import ServerProcess, start_server  # noqa: E402

# Tokens every served test gets: an admin, two tenants, a read-only tenant, a plain writer.
TOKENS: list[dict[str, object]] = [
    {"name": "admin", "admin": True},
    {"name": "tenant-a", "prefixes": ["a:"]},
    {"name": "tenant-b", "prefixes": ["b:"]},
    {"name": "reader-a", "prefixes": ["a:"], "read_only": True},
    {"name": "writer", "prefixes": [""]},
]


class Api:
    """A tiny JSON client for one token: raw requests, raw answers."""

    def __init__(self, server: ServerProcess, token: str | None) -> None:
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {server.tokens.get(token, token)}"
        self.http = httpx.Client(base_url=server.base, headers=headers, timeout=30)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
        return self.http.post(path, json=body, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def ok(self, path: str, body: Any = None) -> Any:
        response = self.post(path, body) if body is not None else self.get(path)
        assert response.status_code == 200, (response.status_code, response.text)
        return response.json()

    def error(self, response: httpx.Response, status: int, code: str) -> str:
        assert response.status_code == status, (response.status_code, response.text)
        body = response.json()
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
        assert body["error"]["code"] == code, body
        assert "Traceback" not in body["error"]["message"]
        return str(body["error"]["message"])

    def close(self) -> None:
        self.http.close()


@dataclass
class Served:
    server: ServerProcess
    backend: str

    def api(self, token: str | None = "admin") -> Api:
        return Api(self.server, token)

    def url(self, token: str = "admin") -> str:
        return self.server.url(token)


@pytest.fixture
def served(backend: BackendUnderTest, tmp_path: Path) -> Iterator[Served]:
    """A real `turnstile serve` process over this test's private store of each backend row."""
    server = start_server(backend.url, tmp_path, tokens=[dict(t) for t in TOKENS],
                          args=("--max-wait", "10", "--observe-interval", "0.5"))
    try:
        yield Served(server, backend.name)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sqlite_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server over SQLite, shared by a module's tests that need no other backend."""
    tmp = tmp_path_factory.mktemp("served")
    server = start_server(f"sqlite:///{tmp}/turnstile.db", tmp, tokens=[dict(t) for t in TOKENS],
                          args=("--max-wait", "10", "--observe-interval", "0.5"))
    try:
        yield Served(server, "sqlite")
    finally:
        server.stop()


def chromium_path() -> str | None:
    path = os.environ.get("TURNSTILE_CHROMIUM", "/usr/bin/chromium")
    return path if os.path.exists(path) else None
