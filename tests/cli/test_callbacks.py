"""``turnstile ask``, ``release`` and ``deliver`` (issue 16 points 1-2), as real processes.

The deliverer test kills a ``turnstile deliver`` process with ``kill -9`` while it is in the
middle of a delivery (the receiver holds the POST open), and shows that a second deliverer
delivers the same grant once the first one's claim lapses: nothing is lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from turnstile._core import callbacks

from ._invoke import command, environment, run, spawn, status, wait_until

SECRET = "cli-callback-secret"


class Receiver:
    """Records signed deliveries; the first POST is held open until ``release_first``."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.arrived = threading.Event()
        self.release_first = threading.Event()
        self.calls = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = callbacks.verify(
                    SECRET.encode(), body, self.headers.get(callbacks.SIGNATURE_HEADER)
                )
                receiver.calls += 1
                if receiver.calls == 1:
                    receiver.arrived.set()
                    receiver.release_first.wait(60)  # the deliverer dies meanwhile
                    return
                if ok:
                    receiver.received.append(json.loads(body))
                self.send_response(200 if ok else 401)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/grant"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release_first.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def test_a_deliverer_killed_mid_delivery_loses_nothing(tmp_path: Path, receiver: Receiver) -> None:
    url = f"sqlite:///{tmp_path / 'cb.db'}"
    env = {"TURNSTILE_CALLBACK_SECRET": SECRET}
    asked = run(
        "ask", "jobs", "--url", url, "--holder", "a", "--callback-url", receiver.url, "--json"
    )
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["acquired"] is True
    claim = "2"
    first = spawn("deliver", "--url", url, "--claim", claim, env=env)
    try:
        assert receiver.arrived.wait(30), "the first deliverer never called"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert receiver.received == []
    assert [h.delivery for h in status(url, "jobs").holders] == ["pending"]
    second = spawn("deliver", "--url", url, "--claim", claim, env=env)
    try:
        wait_until(lambda: len(receiver.received) == 1, 30, "the second deliverer delivers")
        wait_until(
            lambda: [h.delivery for h in status(url, "jobs").holders] == ["delivered"],
            10,
            "the delivery is settled",
        )
    finally:
        second.send_signal(signal.SIGTERM)
        _out, err = second.communicate(timeout=20)
    assert second.returncode == 0, err
    assert "1 delivered" in err
    (lease,) = receiver.received
    assert lease["holder"] == "a" and lease["name"] == "jobs"
    assert SECRET not in err


def test_ask_release_and_status_show_kinds_never_tokens(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cb.db'}"
    token = "task-token-" + "s" * 50
    first = run("ask", "db", "--url", url, "--limit", "1", "--holder", "x", "--task-token", token)
    assert first.returncode == 0, first.stderr
    assert "granted to 'x'" in first.stdout and "delivery pending" in first.stdout
    second = subprocess.run(
        command(["ask", "db", "--url", url, "--holder", "y", "--task-token", "-", "--json"]),
        input=token + "-y\n",
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == {"acquired": False, "position": 0, "token": None}
    shown = run("status", "db", "--url", url)
    assert "sfn (pending)" in shown.stdout and "CALLBACK" in shown.stdout
    as_json = run("status", "--url", url, "--json").stdout
    assert token not in shown.stdout + as_json
    assert '"callback":"sfn"' in as_json and '"delivery":"pending"' in as_json
    (holder,) = status(url, "db").holders
    stale = run("release", "db", "--url", url, "--holder", "x", "--token", str(holder.token + 1))
    assert stale.returncode == 0 and "nothing to release" in stale.stdout
    done = run(
        "release", "db", "--url", url, "--holder", "x", "--token", str(holder.token), "--json"
    )
    assert json.loads(done.stdout) == {"released": True}
    assert [h.holder for h in status(url, "db").holders] == ["y"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--task-token", "x" * 1025], "--task-token must be at most 1024 characters"),
        (["--callback-url", "ftp://h/x"], "must be an http:// or https:// URL"),
        (["--callback-url", "https://u:secretpw@h/x"], "must not carry credentials"),
        (["--task-token", "t", "--ttl", "0"], "argument --ttl"),
        (["--task-token", "t", "--callback-url", "https://h/x"], "not allowed with argument"),
    ],
)
def test_bad_asks_are_refused_without_echoing_secrets(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    url = f"sqlite:///{tmp_path / 'cb.db'}"
    out = run("ask", "db", "--url", url, "--holder", "x", *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert expected in out.stderr
    assert "Traceback" not in out.stderr
    assert "secretpw" not in out.stderr and "x" * 1025 not in out.stderr
