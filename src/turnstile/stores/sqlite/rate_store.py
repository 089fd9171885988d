"""Rate limits on the SQLite store: every step is one ``BEGIN IMMEDIATE`` transaction that
loads a name's rows, runs :mod:`turnstile._core.rate_machine` and writes back what changed
(schema: ``migrations/0004_rates.sql``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

from ..._core import rate_machine
from ..._core.records import RateResult, RateStatus
from .lock_store import SQLiteStore

T = TypeVar("T")


class SQLiteRates:
    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    @staticmethod
    def _load(conn: sqlite3.Connection, name: str) -> rate_machine.RateState:
        row = conn.execute(
            "SELECT rate, per, burst, tat FROM turnstile_rates WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            return rate_machine.RateState()
        state = rate_machine.RateState(int(row[0]), float(row[1]), int(row[2]), float(row[3]))
        state.waiters = [
            rate_machine.RateWaiter(*w)
            for w in conn.execute(
                "SELECT holder, joined_at, expires_at, rank FROM turnstile_rate_waiters"
                " WHERE name = ? ORDER BY rank, seq",
                (name,),
            )
        ]
        state.admitted = [
            float(a)
            for (a,) in conn.execute(
                "SELECT at FROM turnstile_rate_admissions WHERE name = ? ORDER BY at", (name,)
            )
        ]
        return state

    @staticmethod
    def _save(
        conn: sqlite3.Connection,
        name: str,
        before: rate_machine.RateState,
        state: rate_machine.RateState,
        now: float,
    ) -> None:
        if state.idle(now):
            conn.execute("DELETE FROM turnstile_rates WHERE name = ?", (name,))
            conn.execute("DELETE FROM turnstile_rate_waiters WHERE name = ?", (name,))
            conn.execute("DELETE FROM turnstile_rate_admissions WHERE name = ?", (name,))
            return
        conn.execute(
            "INSERT OR REPLACE INTO turnstile_rates (name, rate, per, burst, tat)"
            " VALUES (?, ?, ?, ?, ?)",
            (name, state.rate, state.per, state.burst, state.tat),
        )
        old = {w.holder: w for w in before.waiters}
        new = {w.holder: w for w in state.waiters}
        for holder in old.keys() - new.keys():
            conn.execute(
                "DELETE FROM turnstile_rate_waiters WHERE name = ? AND holder = ?",
                (name, holder),
            )
        for w in state.waiters:  # in line order: new rows get increasing seq (within a rank)
            was = old.get(w.holder)
            if was is None:
                conn.execute(
                    "INSERT INTO turnstile_rate_waiters"
                    " (name, holder, joined_at, expires_at, rank) VALUES (?, ?, ?, ?, ?)",
                    (name, w.holder, w.joined_at, w.expires_at, w.rank),
                )
            elif was.expires_at != w.expires_at:
                conn.execute(
                    "UPDATE turnstile_rate_waiters SET expires_at = ?"
                    " WHERE name = ? AND holder = ?",
                    (w.expires_at, name, w.holder),
                )
        if state.admitted != before.admitted:
            conn.execute(
                "DELETE FROM turnstile_rate_admissions WHERE name = ? AND at <= ?",
                (name, now - state.per),
            )
            last = before.admitted[-1] if before.admitted else None
            for at in state.admitted:
                if last is None or at > last:
                    conn.execute(
                        "INSERT INTO turnstile_rate_admissions (name, at) VALUES (?, ?)",
                        (name, at),
                    )

    def _step(self, name: str, step: Callable[[rate_machine.RateState, float], T]) -> T:
        def tx(conn: sqlite3.Connection) -> T:
            now = self.store._clock()
            state = self._load(conn, name)
            before = rate_machine.RateState(
                state.rate,
                state.per,
                state.burst,
                state.tat,
                [
                    rate_machine.RateWaiter(w.holder, w.joined_at, w.expires_at, w.rank)
                    for w in state.waiters
                ],
                list(state.admitted),
            )
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
