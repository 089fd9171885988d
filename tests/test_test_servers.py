"""The servers the suite runs against are real and reachable (CI must not silently skip),
and the throwaway-server starter (scripts/servers.py) starts, restarts and removes them."""

from __future__ import annotations

import contextlib
import os
from contextlib import AbstractContextManager
from typing import TypeVar

import pytest

from scripts import servers

T = TypeVar("T")


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not set under CI")
        pytest.skip(f"{name} is not set (scripts/dev.py test sets it)")
    return value


def test_redis_is_real() -> None:
    import redis

    client = redis.Redis.from_url(_env("TURNSTILE_TEST_REDIS_URL"))
    try:
        assert client.ping() is True
        assert "redis_version" in client.info("server")
    finally:
        client.close()


def test_redis_cluster_has_three_masters() -> None:
    from redis.cluster import RedisCluster

    url = _env("TURNSTILE_TEST_REDIS_CLUSTER_URL").replace("redis+cluster://", "redis://", 1)
    client = RedisCluster.from_url(url)
    try:
        masters = [n for n in client.get_nodes() if n.server_type == "primary"]
        assert len(masters) >= 3
        assert client.cluster_info()["cluster_state"] == "ok"
    finally:
        client.close()


def test_postgres_is_real() -> None:
    import psycopg

    with psycopg.connect(_env("TURNSTILE_TEST_POSTGRES_URL"), autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
        assert row is not None and row[0] >= 120000


# -- the starter ---------------------------------------------------------------------------
def _start(stack: contextlib.ExitStack, server: AbstractContextManager[T]) -> T:
    try:
        return stack.enter_context(server)
    except servers.Unavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def test_starter_redis_answers_restarts_and_leaves_nothing() -> None:
    with contextlib.ExitStack() as stack:
        server = _start(stack, servers.redis_server("--appendonly", "yes"))
        assert server.folder.is_dir()
        assert server.command("SET", "k", "v") == "OK"
        server.kill()
        assert not servers.port_is_open(server.port)
        server.start()  # same port and folder: the append-only file is read back
        assert server.command("GET", "k") == "v"
        server.pause()
        with pytest.raises(OSError):
            server.command("PING", timeout=0.3)
        server.resume()
        assert server.command("PING") == "PONG"
    assert not servers.port_is_open(server.port)
    assert not server.folder.exists()


def test_starter_redis_with_a_password() -> None:
    with contextlib.ExitStack() as stack:
        server = _start(stack, servers.redis_server("--requirepass", "pw"))
        assert server.command("PING") == "PONG"
        with pytest.raises(servers.RespError, match="NOAUTH"):
            servers.resp(server.port, "PING")


@pytest.mark.slow
def test_starter_redis_cluster_is_formed_and_removed() -> None:
    with contextlib.ExitStack() as stack:
        cluster = _start(stack, servers.redis_cluster(3))
        assert cluster.url == f"redis+cluster://127.0.0.1:{cluster.port}"
        for node in cluster.nodes:
            assert "cluster_state:ok" in node.command("CLUSTER", "INFO")
        slots = cluster.nodes[0].command("CLUSTER", "SLOTS")
        assert sorted(end - start + 1 for start, end, *_ in slots) == [5461, 5461, 5462]
    assert not any(servers.port_is_open(node.port) for node in cluster.nodes)
    assert not cluster.folder.exists()


def test_starter_postgres_answers_restarts_and_leaves_nothing() -> None:
    psycopg = pytest.importorskip("psycopg")
    with contextlib.ExitStack() as stack:
        server = _start(stack, servers.postgres_server({"fsync": "off"}))
        assert server.root.is_dir()
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v int)")
            conn.execute("INSERT INTO kept VALUES (1)")
        server.crash()
        assert not servers.postgres_accepts(server.port)
        server.start()
        with psycopg.connect(server.url, autocommit=True) as conn:
            assert conn.execute("SELECT v FROM kept").fetchall() == [(1,)]
    assert not servers.port_is_open(server.port)
    assert not server.root.exists()
