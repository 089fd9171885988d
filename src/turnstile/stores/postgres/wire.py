"""The client's short path to the server for its own statements (no I/O here).

Every statement the PostgreSQL backends send is one of the fixed texts of ``queries.sql``,
with named parameters of a few plain types. psycopg's cursor is general: per call it parses
the query's placeholders (cached), chooses a dumper per value, manages its prepared-statement
cache and builds a cursor; measured on these statements it is a third of the client's CPU
per call. The short path does that work once per statement text instead:

* :func:`parse` turns ``%(name)s`` placeholders into ``$1``, ``$2``, ... once, and names
  the statement as :mod:`.prepared` does (a hash of its text: the same name means the same
  statement on any server connection, which keeps preparing safe behind a pooler);
* :func:`dump` writes each value in PostgreSQL's text format, leaving its type to the cast
  every placeholder carries (``%(ttl)s::float8``, ``%(ids)s::text[]``), so one prepared
  statement serves every value.

The connection (``_async/backends/postgres_connection.py``) sends the statement with libpq's
own calls and reads the rows with psycopg's loaders. A value :func:`dump` does not write (a
string holding NUL or a lone surrogate, a type none of the statements use), or a query it
cannot compile, goes through psycopg's cursor unprepared (:class:`Unsupported`): psycopg then
reports the value as usual.
"""

from __future__ import annotations

import datetime
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import prepared

_PLACEHOLDER = re.compile(r"%\(([A-Za-z_][A-Za-z0-9_]*)\)s")


class Unsupported(Exception):
    """A query or a value the short path leaves to psycopg's cursor."""


@dataclass(frozen=True, slots=True)
class Statement:
    """One query text ready for the wire: ``text`` with ``$n`` placeholders, the parameter
    names in ``$n`` order, and the name it is prepared under."""

    text: bytes
    params: tuple[str, ...]
    name: bytes


@functools.lru_cache(maxsize=512)
def parse(query: str) -> Statement | None:
    """``query`` (psycopg's ``%(name)s`` style) as a :class:`Statement`, or None if it holds
    anything else psycopg would interpret (a literal ``%``)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    text = _PLACEHOLDER.sub(number, query)
    if "%" in text:
        return None
    data = text.encode("utf-8")
    return Statement(data, tuple(names), prepared.statement_name(data))


def _null(value: None) -> None:
    return None


def _text(value: str) -> bytes:
    if "\x00" in value:
        raise Unsupported("NUL in a string")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        raise Unsupported("a string UTF-8 cannot encode") from None


def _bool(value: bool) -> bytes:
    return b"t" if value else b"f"


def _int(value: int) -> bytes:
    return int.__repr__(value).encode("ascii")


def _float(value: float) -> bytes:
    if math.isfinite(value):
        return float.__repr__(value).encode("ascii")
    if math.isnan(value):
        return b"NaN"
    return b"Infinity" if value > 0 else b"-Infinity"


def _bytes(value: bytes) -> bytes:
    return b"\\x" + value.hex().encode("ascii")


def _element(value: Any) -> bytes:
    """One element of a text array: NULL, or the element's text quoted (backslash before
    ``"`` and ``\\``), which array input reads back as it was whatever it holds (commas,
    braces, spaces, the word NULL)."""
    if value is None:
        return b"NULL"
    if not isinstance(value, str):
        raise Unsupported(f"an array element of type {type(value).__name__}")
    text = _text(value).replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    return b'"' + text + b'"'


def _array(value: list[Any] | tuple[Any, ...]) -> bytes:
    """A list or tuple of strings (or None) as a text array, for a ``::text[]`` cast."""
    return b"{" + b",".join(_element(v) for v in value) + b"}"


def _datetime(value: datetime.datetime) -> bytes:
    if value.tzinfo is None:
        raise Unsupported("a datetime without a time zone")
    return value.isoformat().encode("ascii")


# The writer of each type, looked up by a value's exact type; a subclass (an IntEnum, a str
# subclass) is written as the first base it is an instance of, in this order (bool before
# int).
_WRITERS: dict[type, Callable[[Any], bytes | None]] = {
    type(None): _null,
    str: _text,
    bool: _bool,
    int: _int,
    float: _float,
    bytes: _bytes,
    datetime.datetime: _datetime,
    list: _array,
    tuple: _array,
}


def dump(value: Any) -> bytes | None:
    """``value`` in PostgreSQL's text input format (None: NULL). Raises :class:`Unsupported`
    for a type this path does not write, and for a string holding NUL, which the text
    protocol cannot carry (psycopg's cursor then reports it as usual)."""
    writer = _WRITERS.get(type(value))
    if writer is None:
        kind = next((k for k in _WRITERS if isinstance(value, k)), None)
        if kind is None:
            raise Unsupported(f"a value of type {type(value).__name__}")
        writer = _WRITERS[kind]
    return writer(value)


def values(statement: Statement, params: dict[str, Any]) -> list[bytes | None]:
    """The parameters of one call, in ``$n`` order: :func:`dump` of each, the types every
    call passes (text, NULL, integers, floats) picked by their exact type first, without
    :func:`dump`'s lookup (this runs for every statement)."""
    out: list[bytes | None] = []
    append = out.append
    for name in statement.params:
        value = params[name]
        kind = type(value)
        if kind is str:
            append(_text(value))
        elif value is None:
            append(None)
        elif kind is int:
            append(_int(value))
        elif kind is float:
            append(_float(value))
        else:
            append(dump(value))
    return out
