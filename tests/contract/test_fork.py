"""A client carried across ``os.fork()`` (gunicorn ``--preload``, Celery's prefork pool,
``multiprocessing`` with the fork start method) keeps working in the parent and in the
child: the child opens connections of its own on first use and never touches, closes or
reuses the parent's (a shared socket or SQLite handle would corrupt both)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

import turnstile
from tests.conftest import BackendUnderTest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _child(client: turnstile.Client, report: int) -> None:
    """In the forked child: use the inherited client for a while, then exit with a code."""
    code = 1
    try:
        lock = client.lock("fork:shared", ttl=5)
        for _ in range(30):
            with lock.acquire(timeout=20):
                pass
        with client.lock("fork:child", ttl=5).acquire(timeout=5) as lease:
            os.write(report, f"{lease.token}\n".encode())
        with contextlib.suppress(turnstile.NotSupported):
            client.queue("fork:q").put({"from": "child"})
        code = 0
    except BaseException as exc:  # reported through the exit code and stderr
        os.write(2, f"child failed: {type(exc).__name__}: {exc}\n".encode())
    finally:
        os._exit(code)


def test_a_client_carried_across_fork_works_in_parent_and_child(
    client: turnstile.Client, backend: BackendUnderTest
) -> None:
    lock = client.lock("fork:shared", ttl=5)
    with lock.acquire(timeout=5):  # the parent has connections open, and a renewer
        pass
    try:
        client.queue("fork:q").put({"from": "parent"})
        queues = True
    except turnstile.NotSupported:
        queues = False
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(client, write)
    os.close(write)
    try:
        # Meanwhile the parent takes turns with the child on the same name.
        for _ in range(30):
            with lock.acquire(timeout=20):
                pass
        deadline = time.monotonic() + 60
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline, "the forked child hangs"
            time.sleep(0.02)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 0, "the child failed (see stderr)"
        with os.fdopen(read) as pipe:
            child_token = int(pipe.read().strip())
        # The parent's connections survived the child: it still works, and sees the
        # child's work in the store (a memory:// store is per process: the child's copy).
        with client.lock("fork:child", ttl=5).acquire(timeout=5) as lease:
            if backend.cross_process:
                assert lease.token > child_token
        if queues:
            q = client.queue("fork:q")
            got = [q.get(timeout=5) for _ in range(2 if backend.cross_process else 1)]
            assert [m.payload["from"] for m in got if m is not None] == (
                ["parent", "child"] if backend.cross_process else ["parent"]
            )
            for m in got:
                assert m is not None and m.ack()
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
