"""Server-side prepared statements that stay correct behind any connection pooler (no I/O).

psycopg prepares a statement on a connection under a name it counts per connection
(``_pg3_0``, ``_pg3_1``, ...). Behind a transaction pooler that does not track prepared
statements (PgBouncer before 1.21, or ``max_prepared_statements = 0``), consecutive
transactions of one client connection may run on different server connections, where
``_pg3_0`` may be missing, or be *another client's* statement: executing it would run
someone else's SQL with our parameters. That is why psycopg's advice is to prepare nothing
there.

Turnstile's short path (``wire.py``) names each statement by a hash of its text instead
(:func:`statement_name`, ``_ts_`` and 32 hex digits). A name then means one statement
wherever it is found: a server connection that has it holds exactly our text, so running it
is always right. What a pooler can still do is move a client connection to a server
connection that lacks the name (SQLSTATE 26000 when executing: nothing ran) or that already
has it (42P05 when preparing: nothing ran either). The client handles both
(:func:`miss_kind`): it forgets what it believed was prepared (:func:`recover`), or adopts
the existing statement, and sends the statement again; after :data:`MAX_MISSES` such misses
a client stops preparing altogether, since the server connections evidently do not keep
them. psycopg's own cache is never used (the pool's connections have
``prepare_threshold=None``): a statement the short path does not send goes unprepared.
"""

from __future__ import annotations

import hashlib
from typing import Any

# A client stops preparing after this many statements found missing on, or already present
# on, the server connection it ran on: each costs one more round trip.
MAX_MISSES = 100

# SQLSTATEs of a prepared-statement miss: the named statement is not on this server
# connection (26000, invalid_sql_statement_name), or one of that name already is (42P05,
# duplicate_prepared_statement). Neither ran the statement.
MISSING = "26000"
DUPLICATE = "42P05"

PREFIX = b"_ts_"

def statement_name(query: bytes) -> bytes:
    """The name under which a statement with this text is prepared on every server
    connection: 128 bits of SHA-256, hex. The text alone fixes the statement: it is prepared
    without parameter types, so the server infers them from the text (its casts)."""
    return PREFIX + hashlib.sha256(query).hexdigest()[:32].encode("ascii")


def miss_kind(exc: BaseException) -> str | None:
    """:data:`MISSING` or :data:`DUPLICATE` if ``exc`` is a prepared-statement miss (the
    statement did not run), else None."""
    state = getattr(exc, "sqlstate", None)
    return state if state in (MISSING, DUPLICATE) else None


def short_path_names(conn: Any) -> set[bytes]:
    """The statements the client's short path (``wire.py``) prepared on this connection, by
    name."""
    names: set[bytes] | None = getattr(conn, "_turnstile_prepared", None)
    if names is None:
        names = conn._turnstile_prepared = set()
    return names


def recover(conn: Any, kind: str) -> None:
    """Bring a connection's record in line with its server connection after a miss: on
    26000 it holds none of them (a duplicate, 42P05, is adopted where it happens)."""
    if kind == MISSING:
        short_path_names(conn).clear()
