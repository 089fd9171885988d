"""The servers the suite runs against are real and reachable (CI must not silently skip)."""

from __future__ import annotations

import os

import pytest


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
