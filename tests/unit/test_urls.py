"""URL handling: scheme table, defaults, password redaction, error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

import turnstile
import turnstile.aio
from turnstile._core import urls
from turnstile.errors import ConfigurationError
from turnstile.stores.sqlite.lock_store import parse_path


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:s3cret@host:6379/0", "redis://***@host:6379/0"),
        ("redis://:s3cret@host:6379/0", "redis://***@host:6379/0"),
        ("postgresql://u:p%40ss@db/x?sslmode=require", "postgresql://***@db/x?sslmode=require"),
        ("postgresql://u:a@b@db/x", "postgresql://***@db/x"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("postgresql://user@host/db", "postgresql://***@host/db"),
        ("http://tok3n-as-user-0123456789@h:80", "http://***@h:80"),
        (
            "postgresql://u@h/db?password=pw1&sslmode=x",
            "postgresql://***@h/db?password=***&sslmode=x",
        ),
        (
            "postgresql://h/db?PassWord=pw1&PASSWORD=pw2",
            "postgresql://h/db?PassWord=***&PASSWORD=***",
        ),
        ("postgresql://h/db?pass%77ord=pw1", "postgresql://h/db?pass%77ord=***"),
        (
            "postgresql://h/db?sslpassword=pw1&connect_timeout=3",
            "postgresql://h/db?sslpassword=***&connect_timeout=3",
        ),
        ("redis://h/0?password=pw1&prefix=p:", "redis://h/0?password=***&prefix=p:"),
        ("http://h:8080?token=tk1", "http://h:8080?token=***"),
        (
            "http://h:8080?access_token=tk1&api_key=k&Secret=s",
            "http://h:8080?access_token=***&api_key=***&Secret=***",
        ),
        (
            "postgresql://h/db?listen_url=postgresql%3A%2F%2Fu%3Apw%40l%2Fd",
            "postgresql://h/db?listen_url=postgresql://***@l/d",
        ),
        ("host=db user=u password=pw1", "host=db user=u password=***"),
        ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db"),
        ("sqlite:////abs/x.db", "sqlite:////abs/x.db"),
        ("SQLITE:///x.db", "SQLITE:///x.db"),
        ("memory://", "memory://"),
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert urls.redact(url) == shown


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        ("redis://user:s3cret@host:6379/0", {"s3cret"}),
        ("postgresql://u:p%40ss@db/x", {"p@ss", "p%40ss"}),
        ("postgresql://h/db?password=a+b%21&password=second", {"a b!", "a+b%21", "second"}),
        ("http://tok3n-as-user-0123456789@h:80", {"tok3n-as-user-0123456789"}),
        ("http://h?TOKEN=tk1", {"tk1"}),
        ("postgresql://h/db?listen_url=postgresql%3A%2F%2Fu%3Apw9%40l%2Fd", {"pw9"}),
        ("postgresql://turnstile@db/turnstile", set()),  # a short user name alone is no secret
        ("sqlite:///x.db", set()),
    ],
)
def test_secrets_in(url: str, secrets: set[str]) -> None:
    found = urls.secrets_in(url)
    assert secrets <= set(found), found
    if not secrets:
        assert found == []
    for secret in secrets:
        assert secret not in urls.scrub(f"error near {secret}!", found)


def test_scrub_also_blots_out_password_pairs() -> None:
    assert urls.scrub("dsn: host=x password=hunter2 user=u", []) == (
        "dsn: host=x password=*** user=u"
    )


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


def test_resolve_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TURNSTILE_URL", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert urls.resolve_url(None) == f"sqlite:///{tmp_path}/turnstile/turnstile.db"
    monkeypatch.setenv("TURNSTILE_URL", "memory://")
    assert urls.resolve_url(None) == "memory://"
    assert urls.resolve_url("sqlite:///a.db") == "sqlite:///a.db"
    with pytest.raises(ConfigurationError, match="string"):
        urls.resolve_url(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("empty", ["", " "])
def test_an_empty_url_is_refused(monkeypatch: pytest.MonkeyPatch, empty: str) -> None:
    monkeypatch.delenv("TURNSTILE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="the store URL is empty"):
        urls.resolve_url(empty)
    with pytest.raises(ConfigurationError, match="the store URL is empty"):
        turnstile.connect(empty)
    monkeypatch.setenv("TURNSTILE_URL", empty)
    with pytest.raises(ConfigurationError, match=r"\$TURNSTILE_URL is set but empty"):
        urls.resolve_url(None)
    with pytest.raises(ConfigurationError, match=r"\$TURNSTILE_URL is set but empty"):
        turnstile.connect()


def test_default_store_is_in_the_xdg_state_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert urls.default_sqlite_path() == str(tmp_path / "state" / "turnstile" / "turnstile.db")
    # Unset or relative (the XDG specification says: ignore it): ~/.local/state.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for value in (None, "", "relative/state"):
        if value is None:
            monkeypatch.delenv("XDG_STATE_HOME")
        else:
            monkeypatch.setenv("XDG_STATE_HOME", value)
        assert urls.default_sqlite_path() == str(
            tmp_path / "home" / ".local" / "state" / "turnstile" / "turnstile.db"
        )
    assert urls.default_url() == "sqlite:///" + urls.default_sqlite_path()


def test_connect_uses_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNSTILE_URL", "memory://")
    with turnstile.connect() as client:
        assert client.characteristics.scheme == "memory"
        assert repr(client) == "<Client memory://>"


def test_client_repr_redacts() -> None:
    from turnstile._sync.backends.memory import MemoryBackend
    from turnstile._sync.client import Client

    client = Client(MemoryBackend(), "memory://user:pw@x?token=tk9")
    assert "pw" not in repr(client) and "***" in client.url and "tk9" not in str(client)


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
    assert parse_path("/./x.db") == "./x.db"
    with pytest.raises(ConfigurationError, match="memory://"):
        parse_path("/:memory:")


def test_ordinary_parameters_stay_readable() -> None:
    assert urls.scrub("queue 'q': key=order:42 is held", []) == "queue 'q': key=order:42 is held"
    shown = "redis://h/0?prefix=app:&socket_timeout=3"
    assert urls.redact(shown) == shown
