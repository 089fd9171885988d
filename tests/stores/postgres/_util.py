from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.backends import with_query

ROOT = Path(__file__).resolve().parents[3]


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` every 5 ms until it is true; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def client_connection(client: Any) -> Any:
    """The PostgreSQL connection object (pool, short path, retry loop) behind a client."""
    return client.backend.connection


@contextlib.contextmanager
def small_client(pg_url: str, pool_max: int) -> Iterator[Any]:
    """A client with at most ``pool_max`` pooled connections (1: every statement runs on the
    same one), closed afterwards."""
    import turnstile

    client = turnstile.connect(f"{pg_url}&pool_min=1&pool_max={pool_max}")
    try:
        yield client
    finally:
        client.close()


def unique() -> str:
    return secrets.token_hex(5)


def schema_url(server: str, uid: str, **params: str) -> str:
    """A URL on ``server`` with a schema of this test's own."""
    return with_query(server, schema=f"tt_{uid}", **params)


def spawn_worker(spec: dict[str, Any]) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.stores.postgres._worker", json.dumps(spec)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def check_intervals(events: list[dict[str, Any]], ttl: float) -> None:
    """No two critical sections overlap, tokens increase in grant order, and the line never
    stalled for a lease's ttl (a grant nobody learned of would stall it that long)."""
    held = sorted((e for e in events if e["event"] == "held"), key=lambda e: e["start"])
    for a, b in itertools.pairwise(held):
        assert a["end"] <= b["start"], f"overlapping critical sections: {a} and {b}"
        assert a["token"] < b["token"], f"tokens not increasing: {a} then {b}"
        assert b["start"] - a["end"] < ttl * 0.75, f"the line stalled: {a} then {b}"
