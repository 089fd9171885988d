"""URL handling: scheme table, defaults, password redaction, error messages."""

from __future__ import annotations

import pytest

import turnstile
import turnstile.aio
from turnstile._core import urls
from turnstile.errors import ConfigurationError
from turnstile.stores.sqlite.lock_store import parse_path


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:s3cret@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("postgresql://u:p%40ss@db/x?sslmode=require", "postgresql://u:***@db/x?sslmode=require"),
        ("postgresql://u:a@b@db/x", "postgresql://u:***@db/x"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),
        ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db"),
        ("memory://", "memory://"),
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert urls.redact(url) == shown


def test_redact_unparseable() -> None:
    assert urls.redact("http://[::1") == "<unparseable url>"


def test_unknown_scheme_lists_the_supported_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        urls.split("mongodb://admin:hunter2@db:27017/x")
    message = str(info.value)
    assert "mongodb://" in message
    for scheme in (
        "memory://",
        "sqlite://",
        "redis://",
        "rediss://",
        "redis+cluster://",
        "postgresql://",
    ):
        assert scheme in message
    assert "hunter2" not in message
    assert "***" in message


def test_connect_unknown_scheme_fails_at_once_without_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        turnstile.connect("ftp://me:topsecret@example.com/")
    assert "topsecret" not in str(info.value)
    assert "supported schemes" in str(info.value)
    assert "topsecret" not in repr(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is None


async def test_async_connect_unknown_scheme() -> None:
    with pytest.raises(turnstile.aio.ConfigurationError, match="supported schemes"):
        await turnstile.aio.connect("nope://x")


def test_url_without_scheme() -> None:
    with pytest.raises(ConfigurationError, match="supported schemes"):
        urls.split("just-a-path.db")


def test_scheme_is_case_insensitive() -> None:
    entry, parts = urls.split("SQLITE:///x.db")
    assert entry.module == "sqlite" and parts.path == "/x.db"


def test_resolve_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTILE_URL", raising=False)
    assert urls.resolve_url(None) == "sqlite:///turnstile.db"
    assert urls.resolve_url("") == "sqlite:///turnstile.db"
    monkeypatch.setenv("TURNSTILE_URL", "memory://")
    assert urls.resolve_url(None) == "memory://"
    assert urls.resolve_url("sqlite:///a.db") == "sqlite:///a.db"
    with pytest.raises(ConfigurationError, match="string"):
        urls.resolve_url(42)  # type: ignore[arg-type]


def test_connect_uses_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNSTILE_URL", "memory://")
    with turnstile.connect() as client:
        assert client.characteristics.scheme == "memory"
        assert repr(client) == "<Client memory://>"


def test_client_repr_redacts() -> None:
    from turnstile._sync.backends.memory import MemoryBackend
    from turnstile._sync.client import Client

    client = Client(MemoryBackend(), "memory://user:pw@x")
    assert "pw" not in repr(client) and "***" in client.url


def test_missing_driver_names_the_fix() -> None:
    entry = urls.SCHEMES["redis"]
    err = urls.missing_driver(entry, ModuleNotFoundError("No module named 'redis'", name="redis"))
    assert "pip install 'turnstile-locks[redis]'" in str(err)
    assert "redis" in str(err)


def test_sqlite_paths() -> None:
    assert parse_path("/rel.db") == "rel.db"
    assert parse_path("//abs/x.db") == "/abs/x.db"
    with pytest.raises(ConfigurationError, match="file path"):
        parse_path("/")
    with pytest.raises(ConfigurationError, match="memory://"):
        parse_path("/:memory:")
