"""`turnstile serve` (here `python -m turnstile.server`) as a process: refusals, exit codes,
shutdown."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.http_server import start_server


def serve(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_TOKEN")}
    return subprocess.run(
        [sys.executable, "-m", "turnstile.server", *args],
        capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})},
    )


def test_refuses_a_public_address_without_tokens(tmp_path: Path) -> None:
    result = serve("--url", f"sqlite:///{tmp_path}/t.db", "--host", "0.0.0.0", "--port", "0")
    assert result.returncode == 78
    assert "refusing to listen on '0.0.0.0' without tokens" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"tokens": [{"name": "x", "secret": "short"}]}, "at least 16 characters"),
        ({"tokens": [{"name": "x"}]}, "exactly one of 'secret' or 'sha256'"),
        ({"tokens": [{"name": "x", "secret": "s" * 20, "role": "root"}]}, "unknown key(s)"),
        ({"tokens": [{"name": "x", "sha256": "abc"}]}, "64 hex digits"),
        ({"tokens": [{"name": "x", "secret": "s" * 20, "prefixes": "a:"}]}, "'prefixes'"),
        ({"tokens": [{"name": "x", "secret": "s" * 20, "admin": "yes"}]}, "'admin'"),
        ({"tokens": [{"name": "x", "secret": "s" * 20}, {"name": "x", "secret": "t" * 20}]},
         "duplicate token name"),
    ],
)
def test_bad_token_files_are_refused_clearly(
    tmp_path: Path, document: object, expected: str
) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(document))
    result = serve("--url", "memory://", "--port", "0", "--tokens", str(tokens))
    assert result.returncode == 78, result.stderr
    assert expected in result.stderr
    assert "s" * 20 not in result.stderr  # a secret is never echoed


def test_store_and_socket_problems_have_their_exit_codes(tmp_path: Path) -> None:
    unreachable = serve("--url", "http://127.0.0.1:9", "--port", "0")
    assert unreachable.returncode == 69, unreachable.stderr
    assert "cannot reach the Turnstile service" in unreachable.stderr
    unknown = serve("--url", "nosuch://x", "--port", "0")
    assert unknown.returncode == 78 and "unsupported URL scheme" in unknown.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = serve("--url", "memory://", "--port", str(port))
    assert busy.returncode == 71 and "cannot listen" in busy.stderr
    bad = serve("--url", "memory://", "--max-wait", "0")
    assert bad.returncode == 2 and "max_wait must be between 1 and 3600" in bad.stderr


def test_tokens_from_the_environment(tmp_path: Path) -> None:
    secret = "env-secret-0123456789"
    document = json.dumps({"tokens": [{"name": "from-env", "secret": secret}]})
    ready = tmp_path / "ready"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_TOKEN")}
    env["TURNSTILE_TOKENS"] = document
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnstile.server", "--url", "memory://", "--port", "0",
         "--ready-file", str(ready), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        base = ready.read_text().strip()
        assert httpx.get(base + "/v1/info").status_code == 401
        info = httpx.get(base + "/v1/info", headers={"Authorization": f"Bearer {secret}"})
        assert info.json()["principal"]["name"] == "from-env"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert secret.encode() not in out


def test_sigterm_stops_promptly_and_waiters_leave_the_line(tmp_path: Path) -> None:
    server = start_server(f"sqlite:///{tmp_path}/t.db", tmp_path,
                          tokens=[{"name": "admin", "admin": True}])
    headers = {"Authorization": f"Bearer {server.tokens['admin']}"}
    api = httpx.Client(base_url=server.base, headers=headers)
    api.post("/v1/locks/acquire", json={"name": "held", "holder": "owner", "ttl": 300})
    answers: list[str] = []

    def waiter() -> None:
        try:
            response = httpx.post(server.base + "/v1/locks/acquire", headers=headers,
                                  json={"name": "held", "holder": "patient", "wait": 40},
                                  timeout=60)
            answers.append(response.json()["error"]["code"])
        except httpx.HTTPError as exc:
            answers.append(type(exc).__name__)

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 30
    while not api.post("/v1/locks/status", json={"name": "held"}).json()["waiters"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0
    # Long polls end at once, not after their wait (40 s).
    assert time.monotonic() - started < 20
    thread.join(60)
    assert answers == ["shutting_down"]
    assert "Traceback" not in server.output()
    api.close()
    # The waiter left the line on the way out: the store shows only the owner.
    import turnstile

    client = turnstile.connect(f"sqlite:///{tmp_path}/t.db")
    status = client.status("held")
    client.close()
    assert [h.holder for h in status.holders] == ["owner"] and status.waiters == ()


def test_turnstile_serve_is_a_command_of_the_cli(tmp_path: Path) -> None:
    """`turnstile [--url URL] serve …` (here `python -m turnstile`) runs the same service."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_TOKEN")}
    refused = subprocess.run(
        [sys.executable, "-m", "turnstile", "--url", "memory://", "serve", "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=30, env=base,
    )
    assert refused.returncode == 78 and "without tokens" in refused.stderr
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnstile", "--url", f"sqlite:///{tmp_path}/t.db", "serve",
         "--port", "0", "--ready-file", str(ready), "--log-level", "warning"],
        env=base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        health = httpx.get(ready.read_text().strip() + "/healthz").json()
        assert health == {"status": "ok", "backend": "sqlite"}
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0


def test_open_service_answers_only_loopback_host_names(tmp_path: Path) -> None:
    """Without tokens, a request whose Host is not literally loopback (DNS rebinding from a
    web page) is refused; health and the page itself still answer."""
    server = start_server("memory://", tmp_path)
    try:
        ok = httpx.get(server.base + "/v1/info")
        assert ok.status_code == 200 and ok.json()["principal"]["name"] == "anonymous"
        port = server.base.rsplit(":", 1)[1]
        assert httpx.get(f"http://localhost:{port}/v1/names").status_code == 200
        rebound = httpx.post(server.base + "/v1/locks/acquire", json={"name": "x"},
                             headers={"Host": f"attacker.example:{port}"})
        assert rebound.status_code == 403
        assert rebound.json()["error"]["code"] == "forbidden"
        assert "DNS rebinding" in rebound.json()["error"]["message"]
        assert httpx.get(server.base + "/healthz", headers={"Host": "x.example"}).status_code == 200
    finally:
        server.stop()


def test_configured_queues_are_listed_while_empty(tmp_path: Path) -> None:
    server = start_server(
        f"sqlite:///{tmp_path}/configured.db", tmp_path, args=("--queue", "watched")
    )
    try:
        api = httpx.Client(base_url=server.base, timeout=30)
        assert api.get("/v1/queues").json() == {"queues": ["watched"], "truncated": False}
        api.post("/v1/queues/put", json={"queue": "busy", "payload": 1}).raise_for_status()
        assert api.get("/v1/queues").json()["queues"] == ["busy", "watched"]
        stats = {q["name"]: q["ready"] for q in api.get("/v1/dashboard").json()["queues"]}
        assert stats == {"busy": 1, "watched": 0}
        api.close()
    finally:
        server.stop()
