"""The short path's statement text and value writing (``stores/postgres/wire.py``), without a
server; ``tests/stores/postgres/test_short_path.py`` sends them to one."""

from __future__ import annotations

import datetime
import enum

import pytest

pytest.importorskip("psycopg")

from turnstile.stores.postgres import prepared, wire


def test_placeholders_become_numbered_in_order_of_first_use() -> None:
    s = wire.parse("SELECT f(%(name)s::text, %(ttl)s::float8, %(name)s::text, %(now)s)")
    assert s is not None
    assert s.text == b"SELECT f($1::text, $2::float8, $1::text, $3)"
    assert s.params == ("name", "ttl", "now")
    assert s.name == prepared.statement_name(s.text)
    assert wire.parse("SELECT 1") == wire.Statement(
        b"SELECT 1", (), prepared.statement_name(b"SELECT 1")
    )


def test_a_query_with_another_percent_is_left_to_psycopg() -> None:
    assert wire.parse("SELECT 'x' LIKE 'a%%' AND %(a)s::bool") is None
    assert wire.parse("SELECT %s") is None


def test_the_same_text_is_parsed_once() -> None:
    query = "SELECT %(a)s::int -- parsed once"
    assert wire.parse(query) is wire.parse(query)


class Colour(enum.IntEnum):
    RED = 7


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, None),
        ("héllo", "héllo".encode()),
        ("", b""),
        (True, b"t"),
        (False, b"f"),
        (0, b"0"),
        (-(2**63), b"-9223372036854775808"),
        (Colour.RED, b"7"),
        (1.5, b"1.5"),
        (1e300, b"1e+300"),
        (float("inf"), b"Infinity"),
        (float("-inf"), b"-Infinity"),
        (float("nan"), b"NaN"),
        (b"\x00\xff", b"\\x00ff"),
        (
            datetime.datetime(2026, 11, 26, 9, 30, 0, 123456, tzinfo=datetime.UTC),
            b"2026-11-26T09:30:00.123456+00:00",
        ),
    ],
)
def test_values_in_text_format(value: object, text: bytes | None) -> None:
    assert wire.dump(value) == text


@pytest.mark.parametrize(
    "value",
    [
        "a\x00b",  # the text protocol ends a value at NUL: psycopg's cursor reports it
        "\ud800",  # a lone surrogate: not UTF-8
        datetime.datetime(2026, 11, 26),  # naive: no time zone to send
        [1, 2],  # an array of anything but text
        ["a\x00"],
        {"a": 1},
        bytearray(b"x"),
    ],
)
def test_other_values_are_left_to_psycopg(value: object) -> None:
    with pytest.raises(wire.Unsupported):
        wire.dump(value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ([], b"{}"),
        (["a", None, ""], b'{"a",NULL,""}'),
        (('q"b', "c\\d", "x,y", "NULL"), b'{"q\\"b","c\\\\d","x,y","NULL"}'),
    ],
)
def test_text_arrays(value: object, text: bytes) -> None:
    assert wire.dump(value) == text


def test_values_follow_the_statement_order() -> None:
    s = wire.parse("SELECT %(b)s::int, %(a)s::text, %(b)s::int")
    assert s is not None
    assert wire.values(s, {"a": "x", "b": 2, "unused": 3}) == [b"2", b"x"]


@pytest.mark.parametrize("value", ["a\x00b", "\ud800", [1], datetime.datetime(2026, 1, 1)])
def test_values_refuse_what_dump_refuses(value: object) -> None:
    s = wire.parse("SELECT %(a)s::text")
    assert s is not None
    with pytest.raises(wire.Unsupported):
        wire.values(s, {"a": value})


def test_values_write_subclasses_as_their_base() -> None:
    s = wire.parse("SELECT %(a)s::int, %(b)s::float8, %(c)s::boolean")
    assert s is not None
    assert wire.values(s, {"a": Colour.RED, "b": 2.0, "c": True}) == [b"7", b"2.0", b"t"]
