"""Rate limits on the SQLite store: every step is one ``BEGIN IMMEDIATE`` transaction that
runs :mod:`turnstile._core.rate_machine` on the name's rows: its rate and ``tat`` read at the
start and written back, its line and recent admissions reached through indexes as the step
goes (:class:`StoredRate`; schema: ``migrations/0004_rates.sql``, ``0008``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from ..._core import ranking, rate_machine
from ..._core.records import RateResult, RateStatus
from .lock_store import SQLiteStore, line_position, newest_stamp

T = TypeVar("T")


class StoredRate(rate_machine.RateState):
    """A rate limit's state within one transaction: its rate and ``tat`` read at the start
    and written back by ``SQLiteRates._save``; its line and its recent admissions left in
    their tables and reached through indexes as the step goes, each change written at once
    (as :class:`~turnstile.stores.sqlite.lock_store.StoredName` does for a lock's line). So a
    step costs the same whatever the length of the line or the number of admissions in the
    window. ``stored``: rows of this name may exist: it had a ``turnstile_rates`` row (which
    it has exactly while it has waiter or admission rows), or this step wrote one; until
    then nothing is asked of the tables."""

    __slots__ = ("_conn", "_name", "stored")

    def __init__(self, conn: sqlite3.Connection, name: str, row: tuple[Any, ...] | None) -> None:
        if row is None:
            super().__init__()
        else:
            super().__init__(int(row[0]), float(row[1]), int(row[2]), float(row[3]))
        self._conn, self._name, self.stored = conn, name, row is not None

    def _value(self, sql: str, *args: object) -> Any:
        return self._conn.execute(sql, (self._name, *args)).fetchone()[0]

    def _write(self, sql: str, *args: object) -> int:
        self.stored = True  # rows of this name may exist now
        return self._conn.execute(sql, (self._name, *args)).rowcount

    def has_waiters(self) -> bool:
        return self.stored and bool(
            self._value("SELECT EXISTS (SELECT 1 FROM turnstile_rate_waiters WHERE name = ?)")
        )

    def line_length(self) -> int:
        if not self.stored:
            return 0
        return int(self._value("SELECT count(*) FROM turnstile_rate_waiters WHERE name = ?"))

    def position(self, holder: str) -> int | None:
        if not self.stored:
            return None
        return line_position(self._conn, "turnstile_rate_waiters", self._name, holder)

    def purge_waiters(self, now: float) -> None:
        if self.stored:
            self._write(
                "DELETE FROM turnstile_rate_waiters WHERE name = ? AND expires_at <= ?", now
            )

    def drop_waiter(self, holder: str) -> bool:
        if not self.stored:
            return False
        return (
            self._write("DELETE FROM turnstile_rate_waiters WHERE name = ? AND holder = ?", holder)
            > 0
        )

    def join_line(self, row: rate_machine.RateWaiter, now: float, lead: int) -> int:
        newest = None
        if self.stored:
            newest = newest_stamp(self._conn, "turnstile_rate_waiters", self._name)
        ranking.place(row, now, newest, lead)
        # seq (AUTOINCREMENT) is the newest: behind every entry of its rank, as in the list.
        self._write(
            "INSERT INTO turnstile_rate_waiters (name, holder, joined_at, expires_at, rank)"
            " VALUES (?, ?, ?, ?, ?)",
            row.holder,
            row.joined_at,
            row.expires_at,
            row.rank,
        )
        position = self.position(row.holder)
        assert position is not None  # just written, in this transaction
        return position

    def set_expiry(self, holder: str, expires_at: float) -> None:
        self._conn.execute(
            "UPDATE turnstile_rate_waiters SET expires_at = ? WHERE name = ? AND holder = ?",
            (expires_at, self._name, holder),
        )

    def line(self) -> list[rate_machine.RateWaiter]:
        if not self.stored:
            return []
        return [
            rate_machine.RateWaiter(*w)
            for w in self._conn.execute(
                "SELECT holder, joined_at, expires_at, rank FROM turnstile_rate_waiters"
                " WHERE name = ? ORDER BY rank, seq",
                (self._name,),
            )
        ]

    def has_admissions(self) -> bool:
        return self.stored and bool(
            self._value(
                "SELECT EXISTS (SELECT 1 FROM turnstile_rate_admissions WHERE name = ?)"
            )
        )

    def trim_admissions(self, cutoff: float) -> None:
        if self.stored:
            self._write("DELETE FROM turnstile_rate_admissions WHERE name = ? AND at <= ?", cutoff)

    def record_admission(self, at: float) -> None:
        # The table keeps every admission of the window (bounded by the commits in ``per``
        # seconds); admissions() shows the newest MAX_RECENT, as the reference keeps.
        self._write("INSERT INTO turnstile_rate_admissions (name, at) VALUES (?, ?)", at)

    def admissions(self) -> list[float]:
        if not self.stored:
            return []
        rows = self._conn.execute(
            "SELECT at FROM turnstile_rate_admissions WHERE name = ? ORDER BY at DESC LIMIT ?",
            (self._name, rate_machine.MAX_RECENT),
        ).fetchall()
        return [float(a) for (a,) in reversed(rows)]


class SQLiteRates:
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    @staticmethod
    def _load(conn: sqlite3.Connection, name: str) -> StoredRate:
        row = conn.execute(
            "SELECT rate, per, burst, tat FROM turnstile_rates WHERE name = ?", (name,)
        ).fetchone()
        return StoredRate(conn, name, row)

    @staticmethod
    def _save(
        conn: sqlite3.Connection,
        name: str,
        before: tuple[int, float, int, float] | None,
        state: StoredRate,
        now: float,
    ) -> None:
        """Write back the rate and ``tat`` (the line and the admissions were written as the
        step went); an idle name keeps no row."""
        if state.idle(now):
            if before is not None:
                conn.execute("DELETE FROM turnstile_rates WHERE name = ?", (name,))
            return
        after = (state.rate, state.per, state.burst, state.tat)
        if after != before:
            conn.execute(
                "INSERT OR REPLACE INTO turnstile_rates (name, rate, per, burst, tat)"
                " VALUES (?, ?, ?, ?, ?)",
                (name, *after),
            )

    def _step(self, name: str, step: Callable[[rate_machine.RateState, float], T]) -> T:
        def tx(conn: sqlite3.Connection) -> T:
            now = self.store._clock()
            state = self._load(conn, name)
            before = (state.rate, state.per, state.burst, state.tat) if state.stored else None
            result = step(state, now)
            self._save(conn, name, before, state, now)
            return result

        return self.store._run(tx)

    def acquire(
        self,
        name: str,
        holder: str,
        rate: int,
        per: float,
        burst: int,
        enqueue: bool,
        grace: float,
        priority: int = 0,
        ageing: float | None = None,
    ) -> RateResult:
        return self._step(
            name,
            lambda state, now: rate_machine.acquire(
                state,
                name=name,
                holder=holder,
                rate=rate,
                per=per,
                burst=burst,
                enqueue=enqueue,
                grace=grace,
                now=now,
                priority=priority,
                ageing=ageing,
            ),
        )

    def leave(self, name: str, holder: str) -> bool:
        return self._step(
            name, lambda state, now: rate_machine.leave(state, holder=holder, now=now)
        )

    def status(self, name: str) -> RateStatus:
        return self._step(name, lambda state, now: rate_machine.status(state, name=name, now=now))
