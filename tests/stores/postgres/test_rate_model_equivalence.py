"""The rate-limit SQL functions (migrations/0008_rates.sql) against the reference state
machine (turnstile/_core/rate_machine.py), step for step, on a virtual clock: random
acquires (with and without joining, under the name's rate or another), leaves and status
reads on a few names give the same answers, float for float (the functions do the
reference's arithmetic in double precision), and the same refusals; a name a leave makes
idle keeps no rows; recent admissions stop at MAX_RECENT. Acquires carry random priorities,
some with ageing (_core/ranking.py): the same line order, positions, slots and stamps, and
the same newcomers admitted at once for ranking first."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest

import turnstile
from turnstile._core import rate_machine
from turnstile.errors import LimitConflict

pytestmark = pytest.mark.postgres

T0 = 1_700_000_000.0
GRID = 1 / 64  # exact as a float and in microseconds (the virtual clock's datetime)
NAMES = ["a", "b:{x}", "c ☃"]
HOLDERS = ["h1", "h2", "h3", "h4", "h5", "h6"]
SPECS = [(4, 1.0, 1), (3, 1.0, 2), (7, 2.5, 3), (1, 0.5, 1)]
GRACES = [0.0, 0.25, 1.0, 3.0]
PRIORITIES = [-2, -1, 0, 0, 0, 1, 2]
AGEINGS = [None, None, None, 0.25, 1.0, 4 * GRID]  # levels of a few steps of the clock


class Reference:
    """rate_machine.py over a dict of names, as memory.py keeps them."""

    def __init__(self) -> None:
        self.states: dict[str, rate_machine.RateState] = {}

    def _keep(self, name: str, state: rate_machine.RateState, now: float) -> None:
        if state.idle(now):
            self.states.pop(name, None)
        else:
            self.states[name] = state

    def acquire(self, now: float, name: str, holder: str, **kw: Any) -> Any:
        state = self.states.get(name) or rate_machine.RateState(kw["rate"], kw["per"], kw["burst"])
        result = rate_machine.acquire(state, name=name, holder=holder, now=now, **kw)
        self._keep(name, state, now)
        return result

    def leave(self, now: float, name: str, holder: str) -> bool:
        state = self.states.get(name)
        if state is None:
            return False
        left = rate_machine.leave(state, holder=holder, now=now)
        self._keep(name, state, now)
        return left

    def status(self, now: float, name: str) -> Any:
        state = self.states.get(name) or rate_machine.RateState()
        found = rate_machine.status(state, name=name, now=now)
        self._keep(name, state, now)
        return found


def _outcome(call: Any, *args: Any, **kw: Any) -> Any:
    try:
        return call(*args, **kw)
    except LimitConflict as exc:
        return f"LimitConflict: {exc}"


def _rows(conn: psycopg.Connection[Any], schema: str, name: str) -> int:
    ident = '"' + schema.replace('"', '""') + '"'
    row = conn.execute(
        f"SELECT (SELECT count(*) FROM {ident}.rates r WHERE r.name = %(n)s)"
        f" + (SELECT count(*) FROM {ident}.rate_waiters w JOIN {ident}.rates r"
        f"    ON r.id = w.rate_id WHERE r.name = %(n)s)",
        {"n": name},
    ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("seed", range(4))
def test_sql_rate_functions_follow_the_model(pg_url: str, seed: int) -> None:
    rng = random.Random(seed)
    client = turnstile.connect(pg_url)
    backend: Any = client.backend
    clock = [T0]
    backend.clock_override = lambda: clock[0]
    conn = psycopg.connect(backend.config.conninfo, autocommit=True)
    schema = backend.config.schema
    ref = Reference()
    usual = {name: rng.choice(SPECS) for name in NAMES}
    seen: set[str] = set()
    try:
        for step in range(400):
            clock[0] += GRID * rng.choice([0, 0, 1, 2, 4, 8, 16, 64, 256])
            now = clock[0]
            name, holder = rng.choice(NAMES), rng.choice(HOLDERS)
            op = rng.choices(["acquire", "leave", "status"], [8, 3, 1])[0]
            where = f"seed {seed} step {step}: {op} {name!r} {holder!r} at +{now - T0}"
            if op == "acquire":
                spec = usual[name] if rng.random() < 0.9 else rng.choice(SPECS)
                rate, per, burst = spec
                kw = {
                    "rate": rate,
                    "per": per,
                    "burst": burst,
                    "enqueue": rng.random() < 0.8,
                    "grace": rng.choice(GRACES),
                    "priority": rng.choice(PRIORITIES),
                    "ageing": rng.choice(AGEINGS),
                }
                state = ref.states.get(name)
                newcomer_ahead = (
                    state is not None
                    and bool(state.waiters)
                    and holder not in {w.holder for w in state.waiters}
                )
                want = _outcome(ref.acquire, now, name, holder, **kw)
                got = _outcome(backend.rate_acquire, name, holder, **kw)
                assert got == want, where
                if isinstance(got, str):
                    seen.add("conflict")
                else:
                    usual[name] = spec
                    seen.add("admitted" if got.admitted else "waiting")
                    if got.position:
                        seen.add("behind")
                    if got.admitted and newcomer_ahead:
                        seen.add("admitted ahead of the line")
                    if not got.admitted and got.position is not None and newcomer_ahead:
                        line = ref.states[name].waiters
                        if got.position < len(line) - 1:
                            seen.add("joined ahead")
            elif op == "leave":
                line = [w.holder for w in getattr(ref.states.get(name), "waiters", [])]
                if line and rng.random() < 0.5:
                    holder = rng.choice(line)  # often one in line (maybe expired)
                want = ref.leave(now, name, holder)
                assert backend.rate_leave(name, holder) == want, where
                if want:
                    seen.add("left")
                if name not in ref.states:
                    assert _rows(conn, schema, name) == 0, where
            else:
                want = ref.status(now, name)
                assert backend.rate_status(name) == want, where
        assert {
            "conflict",
            "admitted",
            "waiting",
            "behind",
            "left",
            "admitted ahead of the line",
            "joined ahead",
        } <= seen, seen
    finally:
        conn.close()
        client.close()


def test_recent_admissions_stop_at_max_recent(pg_url: str) -> None:
    client = turnstile.connect(pg_url)
    backend: Any = client.backend
    schema = '"' + backend.config.schema.replace('"', '""') + '"'
    extra = 25
    with psycopg.connect(backend.config.conninfo, autocommit=True) as conn:
        # One statement, one admission per microsecond: every call sees the ones before it.
        conn.execute(
            f"SELECT count(*) FROM generate_series(1, %(n)s) g,"
            f" LATERAL {schema}.rate_acquire('cap', 'h' || g, 1000000, 3600, 1000000, false,"
            f" 0, '2030-01-01 00:00:00+00'::timestamptz + g * interval '1 microsecond') a"
            f" WHERE a.admitted",
            {"n": rate_machine.MAX_RECENT + extra},
        )
        kept = conn.execute(f"SELECT recent FROM {schema}.rates").fetchone()
        rows = conn.execute(f"SELECT count(*), min(at) FROM {schema}.rate_admissions").fetchone()
    assert kept is not None and rows is not None
    assert kept[0] == rows[0] == rate_machine.MAX_RECENT
    # the oldest went: the first kept is admission number extra + 1
    assert rows[1] == pytest.approx(1893456000 + (extra + 1) / 1e6, abs=1e-7)
    client.close()
