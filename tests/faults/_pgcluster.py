"""A throwaway PostgreSQL cluster for fault tests: initdb in a temp dir, a free port,
started, restarted (also crashed) and stopped by the test, deleted afterwards.

PostgreSQL refuses to run as root, so as root the server runs as ``nobody`` (via setpriv).
Nothing here touches any other server or data directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    return candidates[-1] if candidates else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class Cluster:
    def __init__(self) -> None:
        initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            _unavailable("initdb/pg_ctl not found (install the PostgreSQL server package)")
        assert initdb is not None and pg_ctl is not None
        self.initdb, self.pg_ctl = initdb, pg_ctl
        self.root = Path(tempfile.mkdtemp(prefix="turnstile-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._as_nobody = os.geteuid() == 0
        if self._as_nobody:
            os.chown(self.root, 65534, 65534)
        self._run([self.initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust",
                   "-E", "UTF8", "--locale=C", "--no-sync"])
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\nmax_connections = 200\n"
                "shared_buffers = 32MB\nfsync = on\nsynchronous_commit = on\n"
            )
        self.start()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, args: list[str], timeout: float = 120) -> None:
        prefix = (
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
            if self._as_nobody
            else []
        )
        result = subprocess.run(
            prefix + args, capture_output=True, text=True, timeout=timeout, cwd=self.root
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n"
                f"{result.stderr}\n{self.server_log()}"
            )

    def server_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text()[-4000:]
        return ""

    def start(self) -> None:
        self._run([self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                   "start"])
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        self._run([self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])

    def restart(self, mode: str = "fast") -> None:
        """``fast``: a clean shutdown; ``immediate``: a crash (recovery from the WAL)."""
        self.stop(mode)
        self.start()

    def wait_ready(self, timeout: float = 30.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
