"""Server-side prepared statements that stay correct behind any connection pooler (no I/O).

psycopg prepares a statement on a connection under a name it counts per connection
(``_pg3_0``, ``_pg3_1``, ...). Behind a transaction pooler that does not track prepared
statements (PgBouncer before 1.21, or ``max_prepared_statements = 0``), consecutive
transactions of one client connection may run on different server connections, where
``_pg3_0`` may be missing, or be *another client's* statement: executing it would run
someone else's SQL with our parameters. That is why psycopg's advice, and Turnstile's
default until now, was to prepare nothing there.

Turnstile names each statement by a hash of its text and parameter types instead
(:class:`HashedPrepareManager`, ``_ts_`` and 32 hex digits). A name then means one
statement wherever it is found: a server connection that has it holds exactly our text, so
running it is always right. What a pooler can still do is move a client connection to a
server connection that lacks the name (SQLSTATE 26000 when executing: nothing ran) or that
already has it (42P05 when preparing: nothing ran either). The client's retry loop handles
both (:func:`miss_kind`): it forgets what it believed was prepared, or adopts the existing
statement, and sends the statement again; after :data:`MAX_MISSES` such misses a client stops
preparing altogether, since the server connections evidently do not keep them.

The manager is psycopg's own, with the naming changed; :func:`install` puts it on a new
pooled connection and reports ``False`` if this psycopg's internals are not the ones it was
written for, in which case the client does not prepare (always correct, only slower).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
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

try:  # psycopg's private module: checked by install() before use
    from psycopg._preparing import Prepare, PrepareManager
except ImportError:  # pragma: no cover - another psycopg layout: do not prepare
    PrepareManager = object  # type: ignore[assignment,misc]
    Prepare = None  # type: ignore[assignment,misc]


def statement_name(query: bytes, types: tuple[int, ...]) -> bytes:
    """The name under which a statement with this text and these parameter types is
    prepared on every server connection: 128 bits of SHA-256, hex."""
    digest = hashlib.sha256(query)
    digest.update(b"\0" + ",".join(str(t) for t in types).encode("ascii"))
    return PREFIX + digest.hexdigest()[:32].encode("ascii")


class HashedPrepareManager(PrepareManager):
    """psycopg's prepared-statement cache of one connection, naming each statement by
    :func:`statement_name`, and remembering the statement it last asked to prepare so that
    a duplicate can be adopted (:meth:`adopt_last`)."""

    def __init__(self) -> None:
        super().__init__()
        self._last: tuple[Any, bytes] | None = None

    def get(self, query: Any, prepare: bool | None = None) -> tuple[Any, bytes]:
        prep, name = super().get(query, prepare)
        if prep is Prepare.SHOULD:
            key = self.key(query)
            name = statement_name(*key)
            self._last = (key, name)
        return prep, name

    def adopt_last(self) -> None:
        """The server connection already holds the statement this connection tried to
        prepare last (42P05): same name, so same text. Use it from now on."""
        if self._last is not None:
            key, name = self._last
            self._counts.pop(key, None)
            self._names[key] = name
            self._last = None

    def forget(self) -> None:
        """The server connection lacks a statement this connection prepared (26000): it is
        not the one they were prepared on. Forget them all, without deallocating anything
        (they may well be on the server connection they were prepared on)."""
        self._names.clear()
        self._counts.clear()
        self._last = None


def compatible() -> bool:
    """Whether this psycopg's prepared-statement cache is the one :class:`HashedPrepareManager`
    extends (checked on an instance: the attributes it relies on and their types)."""
    if Prepare is None:
        return False
    try:
        probe = HashedPrepareManager()
    except Exception:  # pragma: no cover - defensive: a changed constructor
        return False
    return (
        isinstance(getattr(probe, "_names", None), OrderedDict)
        and isinstance(getattr(probe, "_counts", None), OrderedDict)
        and callable(getattr(probe, "key", None))
        and hasattr(Prepare, "SHOULD")
    )


COMPATIBLE = compatible()


def install(conn: Any) -> bool:
    """Give a new connection the hashed naming, preparing every statement at its first use.
    Returns False (and leaves the connection preparing nothing) if psycopg's internals are
    not the expected ones."""
    if not COMPATIBLE or not isinstance(getattr(conn, "_prepared", None), PrepareManager):
        conn.prepare_threshold = None
        return False
    manager = HashedPrepareManager()
    manager.prepare_threshold = 0
    manager.prepared_max = conn.prepared_max
    conn._prepared = manager
    return True


def miss_kind(exc: BaseException) -> str | None:
    """:data:`MISSING` or :data:`DUPLICATE` if ``exc`` is a prepared-statement miss (the
    statement did not run), else None."""
    state = getattr(exc, "sqlstate", None)
    return state if state in (MISSING, DUPLICATE) else None


def short_path_names(conn: Any) -> set[bytes]:
    """The statements the client's short path (``wire.py``) prepared on this connection, by
    name (its own record: psycopg's cache covers only what psycopg's cursor prepared)."""
    names: set[bytes] | None = getattr(conn, "_turnstile_prepared", None)
    if names is None:
        names = conn._turnstile_prepared = set()
    return names


def recover(conn: Any, kind: str) -> None:
    """Bring a connection's caches in line with its server connection after a miss."""
    if kind == MISSING:
        short_path_names(conn).clear()
    manager = getattr(conn, "_prepared", None)
    if not isinstance(manager, HashedPrepareManager):
        return
    if kind == DUPLICATE:
        manager.adopt_last()
    else:
        manager.forget()
