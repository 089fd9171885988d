"""The servers the suite runs against are real and reachable (CI must not silently skip),
and the throwaway-server starter (scripts/servers.py) starts, restarts and removes them."""

from __future__ import annotations

import contextlib
import os
import time
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


def test_starter_redis_started_twice_is_one_server_and_close_stops_it() -> None:
    """start() of a running server does nothing: a second process on the same port and
    folder would fail to bind while the first, no longer tracked, outlived close()."""
    with contextlib.ExitStack() as stack:
        server = _start(stack, servers.redis_server())
        assert server.proc is not None
        first = server.proc.pid
        server.start()
        assert server.proc.pid == first
        assert f"process_id:{first}" in server.command("INFO", "server")
    assert not servers.port_is_open(server.port)


def test_starter_redis_with_a_password() -> None:
    with contextlib.ExitStack() as stack:
        server = _start(stack, servers.redis_server("--requirepass", "pw"))
        assert server.command("PING") == "PONG"
        with pytest.raises(servers.RespError, match="NOAUTH"):
            servers.resp(server.port, "PING")


def test_starter_redis_does_not_take_another_server_for_its_own() -> None:
    """A port found free can be taken before our server binds it: the server already there
    answers PING, but start() waits for its own, which cannot bind, and says so."""
    with contextlib.ExitStack() as stack:
        first = _start(stack, servers.redis_server())
        second = servers.RedisServer(None, port=first.port, binary=first.binary)
        try:
            with pytest.raises(RuntimeError, match=f"on port {first.port} did not start"):
                second.start()
            assert second.proc is None
        finally:
            second.close()
        assert first.command("PING") == "PONG"


@pytest.mark.slow
def test_starter_redis_cluster_introduces_a_forgotten_node_again() -> None:
    """A CLUSTER MEET whose handshake does not complete in the node timeout is forgotten (a
    busy machine is enough): start() introduces the node again until it is known."""
    cluster = servers.RedisClusterServers(3)
    try:
        for node in cluster.nodes:
            node.start()
        cluster.nodes[2].pause()  # the first MEET to it cannot complete its handshake
        try:
            per = servers.CLUSTER_SLOTS // 3
            for i, node in enumerate(cluster.nodes[:2]):
                node.command("CLUSTER", "ADDSLOTS", *range(i * per, (i + 1) * per))
            cluster.nodes[0].command("CLUSTER", "MEET", servers.HOST, cluster.nodes[2].port)
            # The handshake entry lasts the node timeout (5 s); then it is dropped.
            deadline = time.monotonic() + 30
            while f":{cluster.nodes[2].port}@" in cluster.nodes[0].command("CLUSTER", "NODES"):
                assert time.monotonic() < deadline, "the handshake was never dropped"
                time.sleep(0.2)
        finally:
            cluster.nodes[2].resume()
        cluster.nodes[2].command("CLUSTER", "ADDSLOTS", *range(2 * per, servers.CLUSTER_SLOTS))
        cluster.start()  # assigned already: no ADDSLOTS again, but the MEET again
        for node in cluster.nodes:
            assert "cluster_state:ok" in node.command("CLUSTER", "INFO")
            assert len(node.command("CLUSTER", "NODES").splitlines()) == 3
    finally:
        cluster.close()
    assert not any(servers.port_is_open(node.port) for node in cluster.nodes)


def test_starter_redis_cluster_reports_what_each_node_says_when_it_gives_up() -> None:
    cluster = servers.RedisClusterServers(2)
    try:
        for node in cluster.nodes:
            node.start()
        cluster.nodes[0].command("CLUSTER", "ADDSLOTS", 0)  # formed, but 16,383 slots unowned
        with pytest.raises(RuntimeError) as caught:
            cluster.start(timeout=1)
        message = str(caught.value)
        assert "did not reach cluster_state:ok in 1 s" in message
        for node in cluster.nodes:
            assert f"port {node.port}: {{'cluster_state': 'fail'" in message
    finally:
        cluster.close()
    assert not any(servers.port_is_open(node.port) for node in cluster.nodes)


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
