"""The SQLite store: every operation is one ``BEGIN IMMEDIATE`` transaction that runs the
reference state machine (:mod:`turnstile._core.lock_machine`) on the name's rows: its limit
and holders read at the start and written back where they changed, its line left in its table
and reached through indexes as the step goes (:class:`StoredName`), so a step costs the same
whatever the length of the line.

Concurrency: WAL journal, autocommit connections (one per thread), explicit
``BEGIN IMMEDIATE`` so writers queue on SQLite's lock instead of failing on upgrade, and our
own fine-grained retry on ``SQLITE_BUSY`` (SQLite's built-in busy handler sleeps 1, 2, 5, 10…
ms, far too coarse for a fast handover).

Wake-up: a waiter binds a Unix datagram socket in the abstract namespace whose address is
derived from (database, name, holder); the transaction that grants it a lease sends one
datagram there after commit. One release wakes exactly the waiter it admitted. Where abstract
sockets do not exist (not Linux) waiters fall back to polling ``PRAGMA data_version`` with a
short backoff.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

from ..._core import forks, lock_machine, ranking, urls
from ..._core.records import AcquireResult, CallbackDelivery, Grant, Status
from ...errors import BackendUnavailable, ConfigurationError, TurnstileError

T = TypeVar("T")

ABSTRACT_SOCKETS = sys.platform.startswith("linux")
BUSY_TIMEOUT = 30.0
# Page size of a new database file. The rows are small (a lease is about 100 bytes), and a
# commit appends every page it changed to the WAL: 1 KiB pages write a quarter of the bytes
# per acquire and release than the default 4 KiB, measured about 20% faster
# (benchmarks/results/sqlite.md). A file that exists keeps its page size.
PAGE_SIZE = 1024
# UPDATE ... RETURNING: SQLite 3.35 and later.
RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)


def _migrations() -> list[tuple[int, str]]:
    folder = resources.files("turnstile.stores.sqlite").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.read_text("utf-8")))
    return sorted(found)


MIGRATIONS = _migrations()
SCHEMA_VERSION = MIGRATIONS[-1][0]


def _is_busy(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY / SQLITE_LOCKED: another connection holds the lock for now."""
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc)
    )


class SQLiteStore:
    def __init__(self, path: str, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._closed = False
        self._forks = forks.generation()
        prepare_file(path)
        real = os.path.realpath(path)
        # Identifies this database file; seeds the wake-up addresses of its waiters.
        self.identity = hashlib.sha256(real.encode("utf-8", "surrogatepass")).digest()
        self.wake = WakeChannel(self.identity + b"\0", b"\0turnstile/")
        self._migrate()

    # -- connections and transactions ---------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._closed:  # before the cached connection, which close() has closed
            raise BackendUnavailable("the SQLite client is closed")
        if self._forks != forks.generation():
            self._after_fork()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        try:
            # SQLite's own busy handler only while setting up.
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
            )
            self._use_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=0")
        except sqlite3.Error as exc:
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            raise self._error(exc, "cannot open SQLite database") from exc
        self._local.conn = conn
        with self._all_lock:
            self._all.append(conn)
        return conn

    def _error(self, exc: sqlite3.Error, what: str = "SQLite error on") -> TurnstileError:
        """A file that is not a SQLite database is a configuration error (retrying cannot
        help); anything else means the store is unavailable for now."""
        if _is_not_a_database(exc):
            return ConfigurationError(
                f"{self.path!r} is not a SQLite database ({exc}); give the URL of a Turnstile "
                "database file, or a path where a new one may be created"
            )
        return BackendUnavailable(f"{what} {self.path!r}: {exc}")

    def _after_fork(self) -> None:
        """First use in a forked child: the connections copied from the parent are not ours
        to use or close (SQLite forbids carrying one across fork); open new ones."""
        forks.abandon(*self._all)
        self._all = []
        self._all_lock = threading.Lock()  # another thread may have held it at the fork
        self._local = threading.local()
        self._forks = forks.generation()

    @staticmethod
    def _use_wal(conn: sqlite3.Connection) -> None:
        """Put the database in WAL mode, once for the file, whoever comes first.

        Switching to WAL takes an exclusive lock for a moment, and SQLite answers
        ``database is locked`` at once, without calling the busy handler, to a second
        process that tries the same switch meanwhile (several workers opening a new file
        together). So: look, switch if needed, and on ``locked`` look again after a short
        sleep; by then the other process has usually made the switch for us.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT
        delay = 0.001
        # Takes effect only while the file is still empty (before the switch to WAL below
        # writes its first page); a no-op on an existing database.
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        while True:
            try:
                (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
                if str(mode).lower() != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def _run(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True) -> T:
        """Run ``fn`` in one transaction, retrying briefly while another process writes."""
        conn = self._conn()
        deadline = time.monotonic() + BUSY_TIMEOUT
        delay = 0.0002
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as exc:
                if not _is_busy(exc):
                    raise self._error(exc) from exc
                if time.monotonic() > deadline:
                    raise BackendUnavailable(
                        f"SQLite database {self.path!r} stayed locked for {BUSY_TIMEOUT:.0f} s"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.004)
                continue
            try:
                result = fn(conn)
                conn.execute("COMMIT")
                return result
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._error(exc) from exc
                raise

    def _migrate(self) -> None:
        def apply(conn: sqlite3.Connection) -> None:
            (current,) = conn.execute("PRAGMA user_version").fetchone()
            if current > SCHEMA_VERSION:
                raise ConfigurationError(
                    f"{self.path!r} has Turnstile schema version {current}, newer than this "
                    f"release understands ({SCHEMA_VERSION}); upgrade turnstile"
                )
            for version, script in MIGRATIONS:
                if version > current:
                    for statement in script.split(";\n"):
                        if statement.strip():
                            conn.execute(statement)
                    conn.execute(f"PRAGMA user_version = {int(version)}")

        self._run(apply)

    def close(self) -> None:
        self._closed = True
        if self._forks != forks.generation():
            self._after_fork()  # a child closing what it inherited: leave the parent's alone
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self.wake.close()

    # -- state load/save ----------------------------------------------------------------
    @staticmethod
    def _load(conn: sqlite3.Connection, name: str) -> StoredName:
        # _save keeps a turnstile_names row exactly while the name has holder or waiter rows,
        # so an idle name costs one lookup.
        row = conn.execute(
            "SELECT lim, per_key, EXISTS (SELECT 1 FROM turnstile_waiters WHERE name = ?1)"
            " FROM turnstile_names WHERE name = ?1",
            (name,),
        ).fetchone()
        if row is None:
            return StoredName(conn, name, stored=False, line=False)
        state = StoredName(
            conn, name, stored=True, line=bool(row[2]), limit=row[0], per_key=row[1]
        )
        for h in conn.execute(
            "SELECT holder, token, acquired_at, expires_at, claimed, callback, pending,"
            " claimed_until, attempts, group_key FROM turnstile_holders WHERE name = ?",
            (name,),
        ):
            state.holders[h[0]] = lock_machine.HolderRow(
                h[0], h[1], h[2], h[3], bool(h[4]), h[5], bool(h[6]), h[7], h[8], h[9]
            )
        return state

    @staticmethod
    def _snapshot(
        state: lock_machine.NameState,
    ) -> tuple[tuple[int, int | None], dict[str, tuple[object, ...]]]:
        holders: dict[str, tuple[object, ...]] = {
            k: (
                h.token,
                h.acquired_at,
                h.expires_at,
                h.claimed,
                h.callback,
                h.pending,
                h.claimed_until,
                h.attempts,
                h.key,
            )
            for k, h in state.holders.items()
        }
        return (state.limit, state.per_key), holders

    def _save(
        self,
        conn: sqlite3.Connection,
        name: str,
        before: tuple[tuple[int, int | None], dict[str, tuple[object, ...]]],
        state: StoredName,
    ) -> None:
        """Write back the holders that changed and the name's row (the line's rows were
        written as the step went)."""
        old_limit, old_holders = before
        _, new_holders = self._snapshot(state)
        for holder in old_holders.keys() - new_holders.keys():
            conn.execute(
                "DELETE FROM turnstile_holders WHERE name = ? AND holder = ?", (name, holder)
            )
        for holder, values in new_holders.items():
            if old_holders.get(holder) != values:
                conn.execute(
                    "INSERT OR REPLACE INTO turnstile_holders (name, holder, token,"
                    " acquired_at, expires_at, claimed, callback, pending, claimed_until,"
                    " attempts, group_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (name, holder, *values),
                )
        if state.empty:
            if state.stored:
                conn.execute("DELETE FROM turnstile_names WHERE name = ?", (name,))
        elif (state.limit, state.per_key) != old_limit or not state.stored:
            conn.execute(
                "INSERT OR REPLACE INTO turnstile_names (name, lim, per_key) VALUES (?, ?, ?)",
                (name, state.limit, state.per_key),
            )

    def _token_source(self, conn: sqlite3.Connection, now: float) -> Callable[[], int]:
        if RETURNING:

            def next_token() -> int:
                # lock_machine.clock_token in one statement: max(last + 1, the clock in µs).
                (token,) = conn.execute(
                    "UPDATE turnstile_meta SET value = max(value + 1, ?)"
                    " WHERE key = 'last_token' RETURNING value",
                    (lock_machine.clock_token(0, now),),
                ).fetchone()
                return int(token)

            return next_token

        def next_token_fallback() -> int:
            (last,) = conn.execute(
                "SELECT value FROM turnstile_meta WHERE key = 'last_token'"
            ).fetchone()
            token = lock_machine.clock_token(last, now)
            conn.execute("UPDATE turnstile_meta SET value = ? WHERE key = 'last_token'", (token,))
            return token

        return next_token_fallback

    def _mutate(
        self,
        name: str,
        step: Callable[[StoredName, float, Callable[[], int]], tuple[T, list[str]]],
    ) -> T:
        def tx(conn: sqlite3.Connection) -> tuple[T, list[str]]:
            now = self._clock()
            state = self._load(conn, name)
            before = self._snapshot(state)
            result, woken = step(state, now, self._token_source(conn, now))
            self._save(conn, name, before, state)
            return result, woken

        result, woken = self._run(tx)
        for holder in woken:
            self.wake.signal(name, holder)
        return result

    # -- operations -----------------------------------------------------------------------
    def acquire(
        self,
        name: str,
        holder: str,
        limit: int,
        ttl: float,
        wait_ttl: float,
        enqueue: bool,
        callback: str | None = None,
        priority: int = 0,
        ageing: float | None = None,
        key: str | None = None,
        per_key: int | None = None,
    ) -> AcquireResult:
        return self._mutate(
            name,
            lambda state, now, tokens: lock_machine.acquire(
                state,
                name=name,
                holder=holder,
                limit=limit,
                ttl=ttl,
                wait_ttl=wait_ttl,
                enqueue=enqueue,
                now=now,
                next_token=tokens,
                callback=callback,
                priority=priority,
                ageing=ageing,
                key=key,
                per_key=per_key,
            ),
        )

    # -- callback deliveries (lock_machine.take_deliveries / settle_delivery) -------------
    def _due_names(self, now: float) -> list[str]:
        """Names with callbacks where a step is owed (``lock_machine.due``): a read, so an
        idle deliverer never takes the write lock."""

        def tx(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT name FROM turnstile_holders WHERE pending = 1 AND claimed_until <= ?"
                " UNION SELECT w.name FROM turnstile_waiters AS w"
                " WHERE w.callback IS NOT NULL AND (w.expires_at <= ? OR EXISTS ("
                "  SELECT 1 FROM turnstile_holders AS h WHERE h.name = w.name"
                "  AND h.expires_at <= ?))"
                " UNION SELECT h.name FROM turnstile_holders AS h"
                " WHERE h.pending = 1 AND h.expires_at <= ?",
                (now, now, now, now),
            ).fetchall()
            return [r[0] for r in rows]

        return self._run(tx, write=False)

    def take_deliveries(self, lease: float, max_count: int) -> list[CallbackDelivery]:
        taken: list[CallbackDelivery] = []
        for name in self._due_names(self._clock()):
            if len(taken) >= max_count:
                break
            room = max_count - len(taken)

            def step(
                state: StoredName,
                now: float,
                tokens: Callable[[], int],
                name: str = name,
                room: int = room,
            ) -> tuple[list[CallbackDelivery], list[str]]:
                return lock_machine.take_deliveries(
                    state, name=name, now=now, lease=lease, max_count=room, next_token=tokens
                )

            taken += self._mutate(name, step)
        return taken

    def settle_delivery(self, name: str, token: int, outcome: str, retry_in: float) -> bool:
        return self._mutate(
            name,
            lambda state, now, tokens: lock_machine.settle_delivery(
                state, token=token, outcome=outcome, retry_in=retry_in, now=now, next_token=tokens
            ),
        )

    def pending_deliveries(self) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            (count,) = conn.execute(
                "SELECT count(*) FROM turnstile_holders WHERE pending = 1 AND expires_at > ?",
                (self._clock(),),
            ).fetchone()
            return int(count)

        return self._run(tx, write=False)

    def release(self, name: str, holder: str, token: int | None) -> bool:
        return self._mutate(
            name,
            lambda state, now, tokens: lock_machine.release(
                state, holder=holder, token=token, now=now, next_token=tokens
            ),
        )

    def renew(self, name: str, holder: str, token: int, ttl: float) -> Grant | None:
        def step(
            state: StoredName, now: float, tokens: Callable[[], int]
        ) -> tuple[Grant | None, list[str]]:
            return lock_machine.renew(
                state, name=name, holder=holder, token=token, ttl=ttl, now=now
            ), []

        return self._mutate(name, step)

    def set_limit(self, name: str, limit: int) -> int | None:
        return self._mutate(
            name,
            lambda state, now, tokens: lock_machine.set_limit(
                state, limit=limit, now=now, next_token=tokens
            ),
        )

    def status(self, name: str) -> Status:
        return self._run(
            lambda conn: lock_machine.status(self._load(conn, name), name=name, now=self._clock()),
            write=False,
        )

    def names(self, prefix: str, max_count: int) -> list[str]:
        def tx(conn: sqlite3.Connection) -> list[str]:
            now = self._clock()
            rows = conn.execute(
                "SELECT name FROM turnstile_holders WHERE expires_at > ?"
                " UNION SELECT name FROM turnstile_waiters WHERE expires_at > ?"
                " ORDER BY 1",
                (now, now),
            ).fetchall()
            return [r[0] for r in rows if r[0].startswith(prefix)][:max_count]

        return self._run(tx, write=False)

    def ping(self) -> None:
        self._run(lambda conn: conn.execute("SELECT 1").fetchone(), write=False)

    def data_version(self) -> int:
        try:
            (version,) = self._conn().execute("PRAGMA data_version").fetchone()
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"SQLite error on {self.path!r}: {exc}") from exc
        return int(version)

    # -- wake-up --------------------------------------------------------------------------
    def bind_wake_socket(self, name: str, holder: str) -> socket.socket | None:
        return self.wake.bind(name, holder)


_WAITER = "holder, ttl, wait_ttl, joined_at, expires_at, callback, rank, group_key, seq"


def line_position(conn: sqlite3.Connection, table: str, name: str, holder: str) -> int | None:
    """How many entries of ``name``'s line in ``table`` (a line in ``(rank, seq)`` order:
    ``turnstile_waiters``, ``turnstile_rate_waiters``) stand before ``holder``'s; None if it
    has none. Counts the index entries ahead (one step each, in SQLite's C), no rows read."""
    found = conn.execute(
        f"SELECT (SELECT count(*) FROM {table} AS a WHERE a.name = me.name"
        "  AND (a.rank, a.seq) < (me.rank, me.seq))"
        f" FROM {table} AS me WHERE me.name = ? AND me.holder = ?",
        (name, holder),
    ).fetchone()
    return None if found is None else int(found[0])


def newest_stamp(conn: sqlite3.Connection, table: str, name: str) -> int | None:
    """The newest arrival stamp in ``name``'s line in ``table`` (ranking.stamp_of of its
    ``joined_at``, by the index on ``(name, joined_at)``); None for an empty line."""
    found = conn.execute(
        f"SELECT joined_at FROM {table} WHERE name = ? ORDER BY joined_at DESC LIMIT 1", (name,)
    ).fetchone()
    return None if found is None else ranking.stamp_of(found[0])


@dataclass(slots=True)
class _StoredWaiter(lock_machine.WaiterRow):
    seq: int = 0  # the row's arrival number: the line is in (rank, seq) order


class StoredName(lock_machine.NameState):
    """A name's state within one transaction: its limit and holders read at the start (its
    leases: a few rows) and written back by ``_save``; its line left in
    ``turnstile_waiters`` and reached through the table's indexes as the step goes (by
    holder, by (rank, seq), by expiry, by stamp), each change written at once. So a step
    costs the same on a line of two and of ten thousand, where reading the whole line into
    the reference's list cost milliseconds per thousand waiters. ``stored``: the name had a
    ``turnstile_names`` row, which it has exactly while it has holder or waiter rows. ``line``:
    it had waiter rows; while it has none (an idle name, a lock held with nobody waiting)
    nothing is asked of the table until somebody joins."""

    __slots__ = ("_conn", "_line_rows", "_name", "stored")

    def __init__(
        self,
        conn: sqlite3.Connection,
        name: str,
        *,
        stored: bool,
        line: bool,
        limit: int = 1,
        per_key: int | None = None,
    ) -> None:
        super().__init__(limit=limit, per_key=per_key)
        self._conn, self._name, self.stored = conn, name, stored
        self._line_rows = line  # False: the table holds no row of this line

    def _one(self, sql: str, *args: object) -> Any:
        return self._conn.execute(sql, (self._name, *args)).fetchone()

    def _rows(self, sql: str, *args: object) -> list[_StoredWaiter]:
        return [_StoredWaiter(*r) for r in self._conn.execute(sql, (self._name, *args))]

    def waiter(self, holder: str) -> lock_machine.WaiterRow | None:
        if not self._line_rows:
            return None
        row = self._one(
            f"SELECT {_WAITER} FROM turnstile_waiters WHERE name = ? AND holder = ?", holder
        )
        return None if row is None else _StoredWaiter(*row)

    def has_waiters(self) -> bool:
        if self._line_rows:
            self._line_rows = bool(
                self._one("SELECT EXISTS (SELECT 1 FROM turnstile_waiters WHERE name = ?)")[0]
            )
        return self._line_rows

    def has_callback_waiter(self) -> bool:
        return self._line_rows and bool(
            self._one(
                "SELECT EXISTS (SELECT 1 FROM turnstile_waiters"
                " WHERE name = ? AND callback IS NOT NULL)"
            )[0]
        )

    def waiter_expired(self, now: float) -> bool:
        return self._line_rows and bool(
            self._one(
                "SELECT EXISTS (SELECT 1 FROM turnstile_waiters"
                " WHERE name = ? AND expires_at <= ?)",
                now,
            )[0]
        )

    def purge_waiters(self, now: float) -> bool:
        if not self._line_rows:
            return False
        cursor = self._conn.execute(
            "DELETE FROM turnstile_waiters WHERE name = ? AND expires_at <= ?", (self._name, now)
        )
        return cursor.rowcount > 0

    def line(self) -> Iterator[lock_machine.WaiterRow]:
        if not self._line_rows:
            return
        # Pages of growing size after the last entry given: promote usually needs the first
        # one or two; the caller may drop the entry it was given meanwhile.
        after: tuple[int, ...] = ()  # none yet: from the front
        size = 4
        while True:
            bound = " AND (rank, seq) > (?, ?)" if after else ""
            rows = self._rows(
                f"SELECT {_WAITER} FROM turnstile_waiters WHERE name = ?{bound}"
                " ORDER BY rank, seq LIMIT ?",
                *after,
                size,
            )
            yield from rows
            if len(rows) < size:
                return
            after, size = (rows[-1].rank, rows[-1].seq), min(size * 8, 512)

    def drop_waiter(self, holder: str) -> bool:
        if not self._line_rows:
            return False
        cursor = self._conn.execute(
            "DELETE FROM turnstile_waiters WHERE name = ? AND holder = ?", (self._name, holder)
        )
        return cursor.rowcount > 0

    def join_line(self, row: lock_machine.WaiterRow, now: float, lead: int) -> None:
        newest = None
        if self._line_rows:
            newest = newest_stamp(self._conn, "turnstile_waiters", self._name)
        ranking.place(row, now, newest, lead)
        # seq (AUTOINCREMENT) is the newest: behind every entry of its rank, as in the list.
        self._conn.execute(
            "INSERT INTO turnstile_waiters (name, holder, ttl, wait_ttl, joined_at, expires_at,"
            " callback, rank, group_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self._name,
                row.holder,
                row.ttl,
                row.wait_ttl,
                row.joined_at,
                row.expires_at,
                row.callback,
                row.rank,
                row.key,
            ),
        )
        self._line_rows = True

    def waiter_changed(self, row: lock_machine.WaiterRow) -> None:
        self._conn.execute(
            "UPDATE turnstile_waiters SET ttl = ?, wait_ttl = ?, expires_at = ?, callback = ?"
            " WHERE name = ? AND holder = ?",
            (row.ttl, row.wait_ttl, row.expires_at, row.callback, self._name, row.holder),
        )

    def position(self, holder: str) -> int | None:
        if not self._line_rows:
            return None
        return line_position(self._conn, "turnstile_waiters", self._name, holder)

    def live_waiters(self, now: float) -> list[lock_machine.WaiterRow]:
        if not self._line_rows:
            return []
        return list(
            self._rows(
                f"SELECT {_WAITER} FROM turnstile_waiters WHERE name = ? AND +expires_at > ?"
                " ORDER BY rank, seq",
                now,
            )
        )


class WakeChannel:
    """One-datagram wake-ups between processes sharing a database file.

    The address of ``(name, who)`` is derived from ``seed`` (the database's identity plus the
    kind of waiter) in the abstract Unix socket namespace ``namespace``: the waiter binds it
    before it looks, the transaction that admits it sends one datagram there after commit.
    Without abstract sockets (not Linux) signalling does nothing and waiters poll.
    """

    def __init__(self, seed: bytes, namespace: bytes) -> None:
        self._seed = seed
        self._namespace = namespace
        self._sender: socket.socket | None = None

    def address(self, name: str, who: str) -> bytes:
        digest = hashlib.sha256(self._seed + name.encode() + b"\0" + who.encode()).hexdigest()[:40]
        return self._namespace + digest.encode()

    def signal(self, name: str, who: str) -> None:
        if not ABSTRACT_SOCKETS:
            return
        # Nobody bound (the waiter is between checks or gone), or no descriptor left for the
        # sending socket: the waiter re-checks by itself. Signalling follows a commit, so it
        # must never turn a committed operation into an error.
        with contextlib.suppress(OSError):
            if self._sender is None:
                self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sender.setblocking(False)
            self._sender.sendto(b"1", self.address(name, who))

    def bind(self, name: str, who: str) -> socket.socket | None:
        if not ABSTRACT_SOCKETS:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(self.address(name, who))
        except OSError:
            sock.close()
            return None
        return sock

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None


def _is_not_a_database(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return bool(code == SQLITE_NOTADB)
    return "not a database" in str(exc)


SQLITE_NOTADB = 26


def prepare_file(path: str) -> None:
    """Before the first connection: the default file (:func:`urls.default_sqlite_path`)
    gets its folder (mode 0700) and is created with mode 0600, so only its user can take or
    release its locks; any other path must name a file in a folder that exists (a missing
    folder is a mistake in the URL: it is not created)."""
    try:
        default = urls.default_sqlite_path()
    except ConfigurationError:  # no home directory: then this is not the default
        default = None
    if path == default:
        folder = os.path.dirname(path)
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise ConfigurationError(
            f"the folder of the SQLite file {path!r} does not exist ({folder!r}); create it "
            "first, or fix the path in the URL (sqlite:///relative/path.db, "
            "sqlite:////absolute/path.db)"
        )
    if os.path.isdir(path):
        raise ConfigurationError(
            f"{path!r} is a folder, not a SQLite file; name a file in it, e.g. "
            f"sqlite:///{os.path.join(path, urls.DEFAULT_FILE_NAME)}"
        )


def parse_path(path: str) -> str:
    """``sqlite:///rel.db`` -> ``rel.db``; ``sqlite:////abs/x.db`` -> ``/abs/x.db``."""
    if path.startswith("/"):
        path = path[1:]
    if not path:
        raise ConfigurationError(
            "sqlite URL needs a file path, e.g. sqlite:///./turnstile.db (relative) or "
            "sqlite:////var/lib/turnstile/turnstile.db (absolute)"
        )
    if path == ":memory:":
        raise ConfigurationError(
            "sqlite:///:memory: is private to one connection; use memory:// instead"
        )
    return path
