"""A throwaway PostgreSQL server for fault tests (the shared starter, ``scripts/servers.py``:
initdb in a temporary folder, a free port, run as ``nobody`` when we are root), started,
restarted (also crashed) and stopped by the test, deleted afterwards; and PgBouncer in front
of it. Nothing here touches any other server or data directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time

from scripts import servers
from scripts.servers import Unavailable, free_port

__all__ = ["Bouncer", "Cluster", "Unavailable"]

# Durable as a production server would be: the restart tests check that nothing committed
# is lost when the server crashes.
SETTINGS = {
    "max_connections": 200,
    "shared_buffers": "32MB",
    "fsync": "on",
    "synchronous_commit": "on",
}


def _unavailable(message: str, required: bool = True) -> None:
    """Under pytest: skip (fail under CI=true if ``required``); elsewhere: raise."""
    if "pytest" not in sys.modules:
        raise Unavailable(message)
    import pytest

    if required and os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class Cluster(servers.PostgresServer):
    """A started PostgreSQL server of our own; ``close()`` removes it. Without the server
    binaries the test is skipped (failed under CI); outside pytest ``Unavailable`` is raised."""

    def __init__(self, settings: dict[str, str | int] | None = None) -> None:
        try:
            super().__init__(SETTINGS if settings is None else {**SETTINGS, **settings})
        except Unavailable as exc:
            _unavailable(f"{exc} (install the PostgreSQL server package)")
        try:
            self.start()
        except BaseException:
            self.close()
            raise


class Bouncer:
    """PgBouncer in transaction mode in front of a cluster, with fewer server connections
    than clients, so consecutive statements of one client land on different sessions."""

    def __init__(self, cluster: Cluster, pool_size: int = 2) -> None:
        binary = shutil.which("pgbouncer") or (
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
        as_user = servers.server_user()
        if as_user:
            os.chown(self.ini, as_user["user"], as_user["group"])
        self.proc = subprocess.Popen([binary, str(self.ini)], cwd=root, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, **as_user)
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
