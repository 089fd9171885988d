"""A forked child that closes the client it inherited (an atexit hook, a ``with`` block
unwinding in the child) must not close the parent's connections: closing a PostgreSQL
connection ends its session on the server, so the parent's LISTEN connection would drop."""

from __future__ import annotations

import os
import secrets
import time

import psycopg
import pytest

import turnstile

pytestmark = [pytest.mark.postgres, pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")]


def test_a_child_closing_its_inherited_client_leaves_the_parent_connected(pg_url: str) -> None:
    app = f"ttfork-{secrets.token_hex(4)}"
    client = turnstile.connect(f"{pg_url}&application_name={app}")
    conninfo = client.backend.config.conninfo  # type: ignore[attr-defined]

    def sessions() -> set[int]:
        with psycopg.connect(conninfo, autocommit=True) as admin:
            rows = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s"
                " AND pid <> pg_backend_pid()",
                (app + "%",),
            ).fetchall()
        return {r[0] for r in rows}

    try:
        listener = client.backend.listener  # type: ignore[attr-defined]
        listener.connect(10.0)
        deadline = time.monotonic() + 10
        while not listener.up:
            assert time.monotonic() < deadline, "the LISTEN connection never came up"
            time.sleep(0.01)
        lease = client.lock("fork-close", ttl=10).acquire(timeout=5)  # a pooled connection
        connects = listener.connects
        before = sessions()
        assert len(before) >= 2  # a pooled connection and the LISTEN connection
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                client.close()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.5)  # a LISTEN session ended by the child would be noticed by now
        assert sessions() == before, "the child ended sessions of the parent"
        assert listener.up and listener.connects == connects, "the parent's LISTEN dropped"
        assert lease.release()
    finally:
        client.close()
