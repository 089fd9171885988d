"""Start and stop real ``turnstile serve`` processes for tests (uvicorn on a free port)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

STARTUP_TIMEOUT = 30.0


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    base: str  # http://127.0.0.1:PORT
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)  # token name -> secret

    def url(self, token: str | None = None) -> str:
        """The client URL, with the named token's secret as the URL's password."""
        if token is None:
            return self.base
        return self.base.replace("http://", f"http://:{self.tokens[token]}@", 1)

    def output(self) -> str:
        try:
            return self.log.read_text("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def write_tokens(path: Path, tokens: list[dict[str, object]]) -> dict[str, str]:
    """Write a JSON token file; every entry without a secret gets a fresh one."""
    secrets_by_name: dict[str, str] = {}
    for entry in tokens:
        entry.setdefault("secret", secrets.token_urlsafe(24))
        secrets_by_name[str(entry["name"])] = str(entry["secret"])
    path.write_text(json.dumps({"tokens": tokens}), "utf-8")
    return secrets_by_name


def start_server(
    store_url: str,
    tmp: Path,
    *,
    tokens: list[dict[str, object]] | None = None,
    args: tuple[str, ...] = (),
    preexec_fn: Callable[[], object] | None = None,
) -> ServerProcess:
    uid = secrets.token_hex(4)
    ready = tmp / f"turnstile-ready-{uid}"
    log = tmp / f"turnstile-serve-{uid}.log"
    cmd = [
        sys.executable, "-m", "turnstile.server",
        "--url", store_url,
        "--host", "127.0.0.1",
        "--port", "0",
        "--ready-file", str(ready),
        "--log-level", "warning",
        "--no-access-log",
        *args,
    ]
    secrets_by_name: dict[str, str] = {}
    if tokens is not None:
        token_file = tmp / f"turnstile-tokens-{uid}.json"
        secrets_by_name = write_tokens(token_file, tokens)
        cmd += ["--tokens", str(token_file)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_TOKEN")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec_fn
        )
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(
                f"turnstile serve exited with {proc.returncode}:\n"
                + log.read_text("utf-8", "replace")
            )
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError("turnstile serve did not start:\n" + log.read_text("utf-8"))
        time.sleep(0.02)
    base = ready.read_text("utf-8").strip()
    return ServerProcess(proc, base, log, secrets_by_name)
