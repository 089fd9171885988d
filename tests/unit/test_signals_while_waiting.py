"""A program's own signal handler runs while the library waits in its main thread.

Python runs signal handlers in the main thread, between steps of the interpreter. A signal
that trips a handler just as the main thread goes into a long wait (or that the kernel
hands to another thread) would be acted on only when that wait ends: a SIGTERM handler
that raises SystemExit would run a minute late, at the rate limit's slot. Made certain
here: the waiting program blocks SIGTERM in its main thread, so the kernel hands it to a
thread that only sleeps, and the handler runs only when the main thread comes back to the
interpreter (the sync waits come back every ``SIGNAL_POLL``). SQLite files of the test's
own; real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import turnstile
from tests.conftest import BackendUnderTest

pytestmark = pytest.mark.timeout(120)

PROGRAM = """
import signal, sys, threading, time
import turnstile
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

def stop(signum, frame):
    raise SystemExit(42)

signal.signal(signal.SIGTERM, stop)
url, kind = sys.argv[1], sys.argv[2]
with turnstile.connect(url) as client:
    if kind == "rate":
        client.rate_limit("r", rate=1, per=60.0).acquire(holder="waiting")
    else:
        client.lock("l", ttl=60).acquire(timeout=100, holder="waiting")
sys.exit(0)
"""


def _waiting(url: str, kind: str) -> list[str]:
    with turnstile.connect(url) as client:
        if kind == "rate":
            return [w.holder for w in client.backend.rate_status("r").waiters]
        return [w.holder for w in client.status("l").waiters]


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs pthread_sigmask")
@pytest.mark.parametrize("kind", ["rate", "lock"])
def test_a_handler_runs_while_the_main_thread_waits(tmp_path: Path, kind: str) -> None:
    _handler_runs(f"sqlite:///{tmp_path / 'signals.db'}", kind)


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs pthread_sigmask")
def test_a_handler_runs_while_a_lock_waiter_reads_the_wake_up_connection(
    backend: BackendUnderTest,
) -> None:
    """On Redis and PostgreSQL the waiting main thread reads its client's wake-up connection
    itself (``wakeups.py``), in slices of SIGNAL_POLL there (``_compat.blocking_slice``)."""
    if not backend.cross_process:
        pytest.skip("in-process backend")
    _handler_runs(backend.url, "lock")


def _handler_runs(url: str, kind: str) -> None:
    with turnstile.connect(url) as client:
        if kind == "rate":
            assert client.rate_limit("r", rate=1, per=60.0).try_acquire("first").acquired
        else:
            held = client.lock("l", ttl=60).acquire(holder="first")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        proc = subprocess.Popen(
            [sys.executable, "-c", PROGRAM, url, kind], env=env, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while _waiting(url, kind) != ["waiting"]:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "the program never waited in line"
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            # The slot (or the lock) is a minute away: only the handler ends it sooner.
            assert proc.wait(timeout=30) == 42, proc.stderr.read() if proc.stderr else ""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert _waiting(url, kind) == []  # SystemExit ran the acquire's finally: it left
        if kind == "lock":
            held.release()
