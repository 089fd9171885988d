"""postgresql:// URLs: Turnstile's parameters split off, libpq's passed through, defaults
added, passwords never shown, bad values refused with ConfigurationError."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest

pytest.importorskip("psycopg")

from turnstile import ConfigurationError
from turnstile.stores.postgres import sql as pg


def parse(url: str) -> pg.PostgresConfig:
    return pg.parse_url(url, urlsplit(url))


def query(conninfo: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(conninfo).query))


def test_defaults_and_pass_through() -> None:
    c = parse("postgres://u:pw@h:5433/db?sslmode=require")
    assert c.schema == "turnstile" and (c.pool_min, c.pool_max) == (1, 10)
    assert c.retry_timeout == pg.DEFAULT_RETRY_TIMEOUT
    assert c.prepare and c.statement("acquire") == c.query("acquire_fast")
    assert c.conninfo.startswith("postgres://u:pw@h:5433/db?")
    assert query(c.conninfo) == {
        "sslmode": "require", "connect_timeout": "5", "application_name": "turnstile"
    }
    assert c.listen_conninfo is not None
    assert query(c.listen_conninfo)["application_name"] == "turnstile:listen"


def test_turnstile_parameters_are_removed() -> None:
    c = parse(
        "postgresql://h/db?schema=My%20Schema&pool_min=0&pool_max=3&retry_timeout=0"
        "&application_name=app&connect_timeout=2"
    )
    assert (c.schema, c.pool_min, c.pool_max, c.retry_timeout) == ("My Schema", 0, 3, 0.0)
    assert query(c.conninfo) == {"application_name": "app", "connect_timeout": "2"}
    assert c.connect_timeout == 2.0
    assert c.listen_conninfo is not None
    assert query(c.listen_conninfo)["application_name"] == "app:listen"


def test_spaces_reach_libpq_percent_encoded() -> None:
    """libpq decodes %20 in a URI but takes '+' literally: options=-c%20x%3Dy must arrive as
    "-c x=y" (and application_name with a space as written)."""
    c = parse("postgresql://h/db?options=-c%20track_functions%3Dall&application_name=my%20app")
    raw = urlsplit(c.conninfo).query
    assert "+" not in raw
    assert "options=-c%20track_functions%3Dall" in raw
    assert query(c.conninfo)["application_name"] == "my app"


def test_prepare_option() -> None:
    """prepare=on (the default): server-side prepared statements, and acquire and release
    sent as the plain statements (their relaxed form sets synchronous_commit in the statement
    itself); prepare=off: their function calls."""
    off = parse("postgresql://h/db?prepare=off")
    assert not off.prepare and off.statement("acquire") == off.query("acquire")
    assert off.statement("release") == off.query("release")
    c = parse("postgresql://h/db?prepare=on")
    assert c.prepare and "prepare" not in query(c.conninfo)
    assert c.statement("acquire") == c.query("acquire_fast")
    assert c.statement("release") == c.query("release_fast")
    assert c.statement("renew") == c.query("renew")
    assert "set_config" not in c.statement("acquire")
    relaxed = parse("postgresql://h/db?prepare=on&durability=relaxed")
    for op in ("acquire", "release"):
        assert "set_config('synchronous_commit', 'off', true)" in relaxed.statement(op)
        assert pg.RELAXED_MARK not in relaxed.statement(op)


def test_listen_options() -> None:
    assert parse("postgresql://h/db?listen=off").listen_conninfo is None
    c = parse("postgresql://pool/db?listen_url=postgresql%3A%2F%2Fdirect%3A5432%2Fdb%3Fschema%3Dx")
    assert c.listen_conninfo is not None
    assert urlsplit(c.listen_conninfo).netloc == "direct:5432"
    assert "schema" not in query(c.listen_conninfo)


def test_passwords_are_never_displayed() -> None:
    c = parse(
        "postgresql://u:s3cret@h/db?password=other-pw"
        "&listen_url=postgresql%3A%2F%2Fu%3Alisten-pw%40d%2Fdb"
    )
    for secret in ("s3cret", "other-pw", "listen-pw"):
        assert secret not in c.display
        assert c.scrub(f"error mentioning {secret}") == "error mentioning ***"


def test_channels_and_keys() -> None:
    assert pg.channel_for("turnstile") == "turnstile.turnstile"
    odd = pg.channel_for('We"ird; schema')
    assert odd.startswith("turnstile.") and len(odd) <= 63 and '"' not in odd
    assert pg.wake_key("ab", "c") != pg.wake_key("a", "bc")
    assert len(pg.wake_key("x" * 4096, "y" * 1024)) == 32
    assert pg.render("__SCHEMA__.t", 'a"b') == '"a""b".t'


@pytest.mark.parametrize(
    "params",
    [
        "schema=",
        "schema=" + "x" * 64,
        "pool_min=-1",
        "pool_max=0",
        "pool_max=abc",
        "pool_min=4&pool_max=2",
        "retry_timeout=-1",
        "retry_timeout=inf",
        "retry_timeout=x",
        "listen=sometimes",
        "listen_url=http://x",
        "schema=a&schema=b",
        "prepare=yes",
    ],
)
def test_bad_parameters(params: str) -> None:
    with pytest.raises(ConfigurationError):
        parse("postgresql://u:pw@h/db?" + params)


def test_queries_and_migrations_load() -> None:
    assert {"acquire", "release", "renew", "status", "names", "ping"} <= set(pg.QUERIES)
    assert [v for v, _, _ in pg.MIGRATIONS] == list(range(1, pg.SCHEMA_VERSION + 1))
    for text in pg.QUERIES.values():
        assert "--" not in text.split("\n", 1)[0]


@pytest.mark.parametrize("key", ["listen", "prepare"])
def test_switches_take_on_or_off_in_any_case_and_name_themselves(key: str) -> None:
    off = parse(f"postgresql://h/db?{key}=OFF")
    assert not off.prepare if key == "prepare" else off.listen_conninfo is None
    with pytest.raises(ConfigurationError) as info:
        parse(f"postgresql://h/db?{key}=Maybe")
    assert str(info.value) == f"URL parameter {key}='Maybe' must be 'on' (the default) or 'off'"
