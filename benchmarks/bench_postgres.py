#!/usr/bin/env python3
"""Turnstile's PostgreSQL backend beside pg_advisory_lock and the naive polling lock row.

    python benchmarks/bench_postgres.py            # full run, writes benchmarks/results/postgres.md
    python benchmarks/bench_postgres.py --quick    # tiny sizes, < 60 s, writes nothing (CI)
    python benchmarks/bench_postgres.py --json     # results as JSON on stdout
    python benchmarks/bench_postgres.py --url postgresql://user@host/db   # an existing server

Without ``--url`` (or ``$TURNSTILE_BENCH_POSTGRES_URL``) the script starts a throwaway
PostgreSQL cluster of its own (initdb in a temporary directory, a free port; the fault tests'
helper), so the transaction counters it reads (``pg_stat_database.xact_commit``) count only
this benchmark. On a given server everything lives in a schema of its own, dropped afterwards.
Exits with status 77 when there is neither a URL nor a PostgreSQL installation to start.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turnstile_bench import (
    Contender,
    HandoverResult,
    LockBench,
    Sizes,
    TurnstileLock,
    UncontendedResult,
    WebhookResult,
    command_line,
    fmt,
    handover_table,
    handover_trials_note,
    machine_lines,
    main,
    no_overlaps,
    uncontended_section,
    webhook_table,
)
from turnstile_bench.adapters import (
    NaiveRowLock,
    NotifyRowLock,
    PgAdvisoryLock,
    TransactionCounter,
)
from turnstile_bench.servers import throwaway_postgres

BASELINE = "pg_advisory_lock"
TURNSTILE = "turnstile postgres"
BARE = "turnstile postgres, no renewer"
NOTIFY_ROW = "row + NOTIFY (hand-rolled)"
RELAXED = "turnstile postgres, durability=relaxed"
UNPREPARED = "turnstile postgres, prepare=off"
RELAXED_UNPREPARED = "turnstile postgres, durability=relaxed, prepare=off"
RELAXED_NAIVE = "naive row, synchronous_commit=off"
RELAXED_NOTIFY = "row + NOTIFY, synchronous_commit=off"
NO_HINT = "turnstile postgres, acquire_fast every time"
STRICT = "turnstile postgres, durability=strict"
NAIVE = "naive row (1 s poll)"
UNFLUSHED_NAIVE = "naive row, release without waiting for the disk"
# Issue 13.3: the opt-in fast mode for locks (synchronous_commit off per lock transaction).
TARGET_RELAXED_VS_ADVISORY = 0.6
TARGET_RELAXED_VS_BOUND = 0.9
# Issue 13.2, durable (the default): hand-over p50 at 2 and 8 waiters, webhooks vs the
# perfect-FIFO bound (an earlier aim of 0.90 came before the durable floor, the hand-rolled
# row + NOTIFY, was measured at about that; the relaxed mode keeps 0.9).
TARGET_HANDOVER_P50_MS = 2.0
TARGET_VS_BOUND = 0.85
TARGET_TX_PER_HANDOVER = 3.0


def idle_probe(url: str, schema: str, pause: float, rounds: int = 40) -> dict[str, float]:
    """Median latency (ms) of a ``SELECT 1`` round trip and of a durable one-row UPDATE, back
    to back and after ``pause`` seconds of idleness (what a webhook worker does between
    webhooks): on virtual machines an idle process, backend or disk answers slower."""
    import psycopg

    out: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        table = f'"{schema}".idle_probe'
        conn.execute(f"CREATE TABLE {table} (k int PRIMARY KEY, v bigint)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 0)")
        for label, sql in [
            ("select", "SELECT 1"),
            ("update", f"UPDATE {table} SET v = v + 1 WHERE k = 1"),
        ]:
            for idle in (0.0, pause):
                times = []
                for _ in range(rounds):
                    if idle:
                        time.sleep(idle)
                    started = time.perf_counter()
                    conn.execute(sql)
                    times.append(time.perf_counter() - started)
                key = f"{label}_{'idle' if idle else 'busy'}_ms"
                out[key] = sorted(times)[len(times) // 2] * 1000
        conn.execute(f"DROP TABLE {table}")
    return out


def uncontended_contenders(url: str, schema: str) -> list[Contender]:
    """The uncontended rows only: the same `with` block on a URL with prepare=off (no
    server-side prepared statements; acquire and release as function calls), which the
    default (prepare=on) is compared with, and the naive row committing without waiting for
    the disk, the floor of durability=relaxed."""
    sep = "&" if "?" in url else "?"
    turnstile_url = f"{url}{sep}schema={schema}&prepare=off"
    probe = TransactionCounter(url)
    return [
        Contender(
            STRICT,
            functools.partial(TurnstileLock, f"{url}{sep}schema={schema}&durability=strict"),
            "`with lock.acquire():` on a URL with `durability=strict`: every release waits "
            "for the disk too, as the naive row's does (the default lets a release that "
            "grants nobody commit without waiting: docs/postgres.md, Durability); "
            "uncontended only",
            probe,
        ),
        Contender(
            UNFLUSHED_NAIVE,
            functools.partial(
                NaiveRowLock, url, schema, poll=1.0, timeout=120.0, release_unflushed=True
            ),
            "the naive row whose release (the DELETE) commits with `synchronous_commit = "
            "off`, its acquire durable: the naive row with the durability of Turnstile's "
            "default; uncontended only",
            probe,
        ),
        Contender(
            UNPREPARED,
            functools.partial(TurnstileLock, turnstile_url),
            "`with lock.acquire():` on a URL with `prepare=off` (no server-side prepared "
            "statements: each call parsed and planned): uncontended only",
            probe,
        ),
        Contender(
            RELAXED_UNPREPARED,
            functools.partial(TurnstileLock, f"{turnstile_url}&durability=relaxed"),
            "the same with `durability=relaxed`: uncontended only",
            probe,
        ),
        Contender(
            NO_HINT,
            functools.partial(TurnstileLock, f"{url}{sep}schema={schema}", idle_hint=False),
            "`with lock.acquire():` as the first row, with the client's idle hint off: every "
            "acquire of the name sends `acquire_fast` (the UPDATE, with the function behind "
            "it), never `acquire_idle` (the bare UPDATE); uncontended only",
            probe,
        ),
        Contender(
            RELAXED_NAIVE,
            functools.partial(NaiveRowLock, url, schema, poll=1.0, timeout=120.0, relaxed=True),
            "the naive row on a session with `synchronous_commit = off`: the floor of "
            "`durability=relaxed` (one bare statement per acquire and per release, no line, "
            "lease or token); uncontended only",
            probe,
        ),
    ]


def webhook_contenders(url: str, schema: str) -> list[Contender]:
    """The webhook rows only: the floor of durability=relaxed's webhooks."""
    return [
        Contender(
            RELAXED_NOTIFY,
            functools.partial(NotifyRowLock, url, schema, relaxed=True),
            "the hand-rolled row + NOTIFY on a session with `synchronous_commit = off`: the "
            "floor of `durability=relaxed`'s webhooks (one bare statement per acquire and "
            "per release, every waiter woken to race, no line, lease or token); webhooks only",
            TransactionCounter(url),
        )
    ]


def contenders(url: str, schema: str) -> list[Contender]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    NaiveRowLock.create_table(url, schema)
    sep = "&" if "?" in url else "?"
    turnstile_url = f"{url}{sep}schema={schema}"
    import turnstile

    turnstile.connect(turnstile_url).close()  # create the schema before anyone is timed
    probe = TransactionCounter(url)
    return [
        Contender(
            TURNSTILE,
            functools.partial(TurnstileLock, turnstile_url),
            "`with lock.acquire():` — lease renewed in the background while held",
            probe,
        ),
        Contender(
            BARE,
            functools.partial(TurnstileLock, turnstile_url, renew=False),
            "bare `acquire()` / `release()`, no background renewal",
            probe,
        ),
        Contender(
            RELAXED,
            functools.partial(TurnstileLock, f"{turnstile_url}&durability=relaxed"),
            "`with lock.acquire():` on a URL with `durability=relaxed`: lock transactions "
            "commit without waiting for the disk (docs/postgres.md, Durability)",
            probe,
        ),
        Contender(
            BASELINE,
            functools.partial(PgAdvisoryLock, url),
            "`SELECT pg_advisory_lock(k)` / `pg_advisory_unlock(k)` on a session of its own",
            probe,
        ),
        Contender(
            NAIVE,
            # A polling row has no line: with 32 pollers one can lose every poll for longer
            # than the default 30 s, which is the finding, not a failure of the run.
            functools.partial(NaiveRowLock, url, schema, poll=1.0, timeout=120.0),
            "`INSERT ... ON CONFLICT DO UPDATE ... WHERE expired`, retried once a second",
            probe,
        ),
        Contender(
            "naive row (50 ms poll)",
            functools.partial(NaiveRowLock, url, schema, poll=0.05, timeout=120.0),
            "the same, retried every 50 ms",
            probe,
        ),
        Contender(
            NOTIFY_ROW,
            functools.partial(NotifyRowLock, url, schema),
            "the same row, but waiters sleep on LISTEN and release deletes + NOTIFYs in one "
            "statement: every waiter wakes and races (no line, no lease, no token) — about "
            "the least any durable lock with push wake-ups can cost per hand-over",
            probe,
        ),
    ]


def _percent(value: float, target: float) -> str:
    """``value`` as a percentage, with a decimal where a whole number would show a miss of
    ``target`` as a hit ("85% ... missed")."""
    for digits in (0, 1, 2):
        shown = f"{value:.{digits}%}"
        if value == target or shown != f"{target:.{digits}%}":
            return shown
    return shown


def _groups(handover: list[HandoverResult]) -> list[list[HandoverResult]]:
    sizes = sorted({r.processes for r in handover})
    return [[r for r in handover if r.processes == n] for n in sizes]


def _tx(r: HandoverResult | WebhookResult) -> float:
    return r.per_grant.get("transactions", math.nan)


def _paired(a: UncontendedResult, b: UncontendedResult) -> list[float]:
    """``a``'s rate over ``b``'s in each trial: the trials run every row one after another,
    so a ratio within one trial is spared the drift of this machine between trials."""
    if len(a.trials) != len(b.trials):
        return []
    return [x / y for x, y in zip(a.trials, b.trials, strict=True) if y > 0]


def _where_the_time_goes(unc: dict[str, UncontendedResult]) -> str:
    """What separates Turnstile's uncontended cycle from the naive row's, from the table's
    client CPU, waiting and server CPU columns (a sentence; empty without them)."""

    def split(r: UncontendedResult) -> str:
        if math.isnan(r.server_us):
            return f"{r.cpu_us:.0f} µs of client CPU and {r.wait_us:.0f} µs waiting"
        return (
            f"{r.cpu_us:.0f} µs of client CPU, {r.server_us:.0f} µs of server CPU and "
            f"{max(0.0, r.wait_us - r.server_us):.0f} µs of neither"
        )

    pairs = [(TURNSTILE, NAIVE), (RELAXED, RELAXED_NAIVE)]
    parts = []
    for mine, theirs in pairs:
        if mine not in unc or theirs not in unc or math.isnan(unc[mine].cpu_us):
            continue
        parts.append(
            f"{mine} {split(unc[mine])} per acquire + release, {theirs} {split(unc[theirs])}"
        )
    if not parts:
        return ""
    base = unc[BASELINE]
    out = (
        "Where the time goes (the table's last columns): "
        + "; ".join(parts)
        + f"; pg_advisory_lock {split(base)}."
    )
    a, b = unc.get(TURNSTILE), unc.get(NAIVE)
    if a is not None and b is not None and not math.isnan(a.server_us + b.server_us):
        gap = 1e6 / a.ops_per_s - 1e6 / b.ops_per_s
        client, server = a.cpu_us - b.cpu_us, a.server_us - b.server_us
        out += (
            f" A Turnstile cycle is {gap:+.0f} µs against the naive row's: {client:+.0f} µs "
            f"of client CPU, {server:+.0f} µs of server CPU and {gap - client - server:+.0f} "
            "µs of neither"
        )
    return out + (
        ". What each side does: Turnstile's client runs the lease and its renewer, the "
        "holder id, the idle hint and the short path's parameters around each statement, "
        "and its statements do more on the server than the naive row's (the fencing "
        "counter, the lease's times, the answer's columns: each execution sets up more "
        "expressions); *neither* is the network, the disk and the scheduler."
    )


def interpretation(results: dict[str, Any]) -> list[str]:
    """Generated from the numbers of this run."""
    lines = []
    certain_total = 0
    groups = _groups(results["handover"])
    for group in groups:
        by = {r.label: r for r in group}
        t, adv, push = by[TURNSTILE], by[BASELINE], by[NOTIFY_ROW]
        n1, n50 = by[NAIVE], by["naive row (50 ms poll)"]
        certain_total += t.certain_fifo_violations or 0
        lines.append(
            f"- **Handover, {t.processes - 1} waiters.** Turnstile {fmt(t.gap_p50_ms)} ms p50 "
            f"/ {fmt(t.gap_p99_ms)} ms p99, {t.certain_fifo_violations} certain FIFO "
            f"violations ({t.fifo_violations} by call time), {fmt(_tx(t))} transactions per "
            f"grant. Hand-rolled row + NOTIFY {fmt(push.gap_p50_ms)} / {fmt(push.gap_p99_ms)} "
            f"ms ({push.fifo_violations} violations by call time, longest streak "
            f"{push.longest_streak}). pg_advisory_lock {fmt(adv.gap_p50_ms)} / "
            f"{fmt(adv.gap_p99_ms)} ms, {adv.fifo_violations} by call time, no writing "
            f"transaction. Naive row: {fmt(n1.gap_p50_ms)} ms p50 with a 1 s poll "
            f"({n1.fifo_violations} violations, longest streak {n1.longest_streak}), "
            f"{fmt(n50.gap_p50_ms)} ms with 50 ms ({n50.fifo_violations} violations, "
            f"{fmt(_tx(n50))} transactions per grant)."
        )
    t_call = [next(r for r in g if r.label == TURNSTILE).fifo_violations for g in groups]
    adv_call = [next(r for r in g if r.label == BASELINE).fifo_violations for g in groups]
    lines.append(
        "- **FIFO.** *Certain* violations (a grant that overtook a request the lock had "
        "already confirmed in line before the overtaker even asked; no clock tolerance) are "
        f"{certain_total} for Turnstile in every run above. The call-time heuristic (grants "
        "that overtook a worker that *called* acquire more than 1 ms earlier) shows "
        f"{' / '.join(map(str, t_call))} for Turnstile and "
        f"{' / '.join(map(str, adv_call))} for pg_advisory_lock, whose server-side queue "
        "grants strictly in arrival order: with many more processes than the 2 cores, a "
        "worker is often descheduled for more than 1 ms between reading the clock and its "
        "request reaching the server, which that heuristic cannot tell from overtaking."
    )
    bare = {r.processes: r for r in results["handover"] if r.label == BARE}
    push = {r.processes: r for r in results["handover"] if r.label == NOTIFY_ROW}
    t_by = {r.processes: r for r in results["handover"] if r.label == TURNSTILE}
    lines.append(
        "- **Where the hand-over time goes.** One durable transaction (the holder's release, "
        "which grants the front waiter and sends one NOTIFY carrying the grant to that "
        "waiter's client only), then the wake-up: the server signals the listening backend, "
        "which sends the notification on the waiting client's LISTEN connection, which the "
        "waiting thread itself reads (the client's waiters read it in turns: docs/postgres.md, "
        '"Wake-ups"). The waiter starts without another transaction; a grant is claimed '
        "for the full ttl (one renewal) only a third of the way into its short wait_ttl "
        "lease, so these 2 ms critical sections never pay it. The durable floor is the "
        "hand-rolled row + NOTIFY (one statement per hand-over, no line, no lease, no "
        "token): Turnstile / floor p50 "
        + ", ".join(
            f"{fmt(t_by[n].gap_p50_ms)} / {fmt(push[n].gap_p50_ms)} ms"
            for n in sorted(t_by)
            if n in push
        )
        + ". Without the `with` block's renewer: "
        + ", ".join(f"{fmt(bare[n].gap_p50_ms)} ms" for n in sorted(bare))
        + ". pg_advisory_lock hands over inside the server's lock manager: no commit, no WAL "
        "flush, no notification. What grows with the number of waiters is PostgreSQL's "
        "NOTIFY itself: up to version 18 the server signals *every* backend that listens on "
        "any channel of the database at each NOTIFY, so each hand-over wakes all 32 idle "
        "LISTEN backends for a moment on these 2 cores (a change committed for PostgreSQL 19 "
        "signals only the channel's listeners, which is what the per-client channels are "
        "built for)."
    )
    all_t = [r for r in results["handover"] if r.label == TURNSTILE]
    tx = max((_tx(r) for r in all_t), default=math.nan)
    summary = [
        f"handover p50 ≤ {TARGET_HANDOVER_P50_MS:g} ms "
        + ", ".join(
            f"{'met' if t_by[n].gap_p50_ms <= TARGET_HANDOVER_P50_MS else 'missed'} at "
            f"{n - 1} waiters ({fmt(t_by[n].gap_p50_ms)} ms)"
            for n in sorted(t_by)
        ),
        f"0 FIFO violations {'met' if certain_total == 0 else f'missed ({certain_total})'} "
        "(certain violations; see FIFO below)",
        f"≤ {TARGET_TX_PER_HANDOVER:g} transactions per handover "
        f"{'met' if tx <= TARGET_TX_PER_HANDOVER else 'missed'} (at most {fmt(tx)} per grant: "
        "the waiter joining the line and the holder's release that grants it)",
    ]
    for group in results["webhooks"]:
        by = {r.label: r for r in group}
        t, adv, pr = by[TURNSTILE], by[BASELINE], by[NOTIFY_ROW]
        n1, n50 = by[NAIVE], by["naive row (50 ms poll)"]
        summary.append(
            f"webhooks ({t.scenario}) ≥ {TARGET_VS_BOUND:.0%} of a perfect FIFO lock "
            f"{'met' if t.vs_bound >= TARGET_VS_BOUND else 'missed'} "
            f"({_percent(t.vs_bound, TARGET_VS_BOUND)}; "
            f"the durable floor, row + NOTIFY, {pr.vs_bound:.0%})"
        )
        lines.append(
            f"- **Webhooks, {t.scenario}, {t.workers} workers, {fmt(t.work_ms, 0)} ms each** "
            f"(median of {len(t.trials)} trials). A perfect zero-overhead FIFO lock reaches "
            f"efficiency {fmt(t.bound_efficiency)}. Turnstile {fmt(t.efficiency)} "
            f"({t.vs_bound:.0%} of it, {t.order_violations} of {t.events} out of order, "
            f"{t.certain_lock_fifo_violations} certain lock FIFO violations); hand-rolled row "
            f"+ NOTIFY {fmt(pr.efficiency)} ({pr.vs_bound:.0%}, {pr.order_violations} out of "
            f"order); pg_advisory_lock {fmt(adv.efficiency)} ({adv.vs_bound:.0%}, "
            f"{adv.order_violations} out of order); naive row {fmt(n1.efficiency)} with a 1 s "
            f"poll ({n1.vs_bound:.0%}, {n1.order_violations} out of order"
            + (f", {n1.failed} timed out" if n1.failed else "")
            + f"), {fmt(n50.efficiency)} with 50 ms ({n50.vs_bound:.0%})."
        )
    idle = results["idle"]
    hooks = results["webhooks"][0]
    floor_eff = next(r for r in hooks if r.label == NOTIFY_ROW).vs_bound
    t_eff = next(r for r in hooks if r.label == TURNSTILE).vs_bound
    lines.append(
        "- **Durability after idleness.** Between webhooks a worker sleeps "
        f"{fmt(hooks[0].work_ms, 0)} ms, and on this virtual machine a process, a server "
        "backend or the disk that has been idle that long answers slower (measured in this "
        f"run: a `SELECT 1` round trip {fmt(idle['select_busy_ms'])} ms back to back, "
        f"{fmt(idle['select_idle_ms'])} ms after the pause; a durable one-row UPDATE "
        f"{fmt(idle['update_busy_ms'])} ms vs {fmt(idle['update_idle_ms'])} ms). Each "
        "webhook of an order's chain waits for at least one durable commit plus a wake-up; "
        "pg_advisory_lock writes nothing. The hand-rolled row + NOTIFY, one statement per "
        f"hand-over and the cheapest durable push lock, reaches {floor_eff:.0%} of the "
        f"perfect lock on the demo's webhooks, Turnstile {_percent(t_eff, floor_eff)}. "
        "Turnstile's steps run a few more statements in the same transactions (the line, "
        "the lease and the fencing token), and its waiter reads the wake-up itself; the "
        "floor wakes every waiter to race for the row. A run this short would also pay a "
        "new server connection's first steps (PostgreSQL compiles a function and plans its "
        "statements at their first use on a connection: docs/postgres.md, \"A new "
        "connection's first steps\"), which every worker's warm-up pays before the start."
    )
    unc: dict[str, UncontendedResult] = {r.label: r for r in results["uncontended"]}
    t, b, bare_u = unc[TURNSTILE], unc[BASELINE], unc.get(BARE)
    lines.append(
        f"- **Uncontended.** Turnstile {fmt(t.ops_per_s)} acquire+release/s"
        + (f" ({fmt(bare_u.ops_per_s)}/s without the renewer)" if bare_u else "")
        + (f", {fmt(unc[UNPREPARED].ops_per_s)}/s with `prepare=off`" if UNPREPARED in unc else "")
        + (
            f", {fmt(unc[NO_HINT].ops_per_s)}/s with `acquire_fast` every time (the idle "
            'hint off: docs/postgres.md, "A name that was idle")'
            if NO_HINT in unc
            else ""
        )
        + f", pg_advisory_lock {fmt(b.ops_per_s)}/s, naive row "
        f"{fmt(unc[NAIVE].ops_per_s)}/s. An advisory lock writes nothing: "
        "no WAL, no commit to flush. Each Turnstile acquire and release is a committed "
        "transaction. The acquire waits for its WAL flush (`synchronous_commit = on`), as "
        "the naive row's INSERT does; the release of a name nobody waits for grants nobody, "
        "so by default it commits without waiting for the disk (a crash can forget it only "
        "by leaving the name held until that lease runs out: docs/postgres.md, Durability)"
        + (
            f"; with `durability=strict` every release waits too, the naive row's fsyncs: "
            f"{fmt(unc[STRICT].ops_per_s)}/s"
            if STRICT in unc
            else ""
        )
        + (
            f"; the naive row with its release not waiting either: "
            f"{fmt(unc[UNFLUSHED_NAIVE].ops_per_s)}/s"
            if UNFLUSHED_NAIVE in unc
            else ""
        )
        + ". On an idle name each is one UPDATE of the name's row "
        "(schema version 12: the grant kept in the row, a HOT update, the fencing counter "
        "written with it), sent as one plain prepared statement (named by a hash of its "
        "text, so safe through any pooler): the acquire and release of a name that was idle "
        "at its last four acquires as bare UPDATEs (`acquire_idle`, `release_idle`; when the "
        "name is busy the client then calls the PL/pgSQL function), otherwise with the "
        "function behind them, called only when the name is busy (with `prepare=off`, the "
        "function call, parsed and planned at "
        "every call); no waiter is armed and no LISTEN connection opened unless the acquire has "
        "to wait; the client sends it by its short path (docs/postgres.md, \"The client's "
        'short path": no cursor, no pool checkout). '
        + _where_the_time_goes(unc)
    )
    naive_u = unc[NAIVE].ops_per_s
    summary.insert(
        0,
        f"durable uncontended ≥ 1.0x the naive row "
        f"{'met' if t.ops_per_s >= naive_u else 'missed'} ({fmt(t.ops_per_s)}/s = "
        f"{t.ops_per_s / naive_u:.2f}x"
        + (
            f"; trial by trial (each trial runs every row in turn) "
            f"{' / '.join(f'{r:.2f}' for r in paired)}x"
            if (paired := _paired(t, unc[NAIVE]))
            else ""
        )
        + (
            f"; with durability=strict, the naive row's fsyncs, "
            f"{fmt(unc[STRICT].ops_per_s)}/s = {unc[STRICT].ops_per_s / naive_u:.2f}x"
            if STRICT in unc
            else ""
        )
        + (
            f"; against the naive row whose release does not wait for the disk either, "
            f"{fmt(unc[UNFLUSHED_NAIVE].ops_per_s)}/s: "
            f"{t.ops_per_s / unc[UNFLUSHED_NAIVE].ops_per_s:.2f}x"
            if UNFLUSHED_NAIVE in unc
            else ""
        )
        + (
            f"; with prepare=off {fmt(unc[UNPREPARED].ops_per_s)}/s = "
            f"{unc[UNPREPARED].ops_per_s / naive_u:.2f}x"
            if UNPREPARED in unc
            else ""
        )
        + ")",
    )
    relaxed_u = unc.get(RELAXED)
    if relaxed_u is not None:
        ratio = relaxed_u.ops_per_s / b.ops_per_s
        both = unc.get(RELAXED_UNPREPARED)
        summary.append(
            f"durability=relaxed uncontended ≥ {TARGET_RELAXED_VS_ADVISORY:g}x "
            f"pg_advisory_lock {'met' if ratio >= TARGET_RELAXED_VS_ADVISORY else 'missed'} "
            f"({fmt(relaxed_u.ops_per_s)}/s = {ratio:.2f}x"
            + (
                f"; with prepare=off {fmt(both.ops_per_s)}/s = {both.ops_per_s / b.ops_per_s:.2f}x"
                if both is not None
                else ""
            )
            + f"; durable {fmt(unc[TURNSTILE].ops_per_s)}/s"
            + (
                f"; the floor, the naive row with synchronous_commit = off, "
                f"{fmt(unc[RELAXED_NAIVE].ops_per_s)}/s = "
                f"{unc[RELAXED_NAIVE].ops_per_s / b.ops_per_s:.2f}x"
                if RELAXED_NAIVE in unc
                else ""
            )
            + ")"
        )
    for group in results["webhooks"]:
        found = {r.label: r for r in group}
        if RELAXED in found:
            r = found[RELAXED]
            floor = found.get(RELAXED_NOTIFY)
            summary.append(
                f"durability=relaxed webhooks ({r.scenario}) ≥ {TARGET_RELAXED_VS_BOUND:.0%} "
                f"of a perfect FIFO lock "
                f"{'met' if r.vs_bound >= TARGET_RELAXED_VS_BOUND else 'missed'} "
                f"({_percent(r.vs_bound, TARGET_RELAXED_VS_BOUND)}, "
                f"{r.order_violations} out of order"
                + (
                    f"; the relaxed floor, row + NOTIFY with synchronous_commit = off, "
                    f"{_percent(floor.vs_bound, r.vs_bound)}"
                    if floor is not None
                    else ""
                )
                + ")"
            )
    relaxed_h = [r for r in results["handover"] if r.label == RELAXED]
    if relaxed_h:
        lines.append(
            "- **durability=relaxed.** The same functions, each lock transaction committed "
            "with `synchronous_commit = off` (queues stay durable; a server crash can forget "
            "the last grants, whose holders learn it at their next renewal, and tokens never "
            "repeat: tests/stores/postgres/test_relaxed.py). Hand-over p50 "
            + ", ".join(
                f"{fmt(r.gap_p50_ms)} ms at {r.processes - 1} waiters "
                f"({r.certain_fifo_violations} certain FIFO violations)"
                for r in relaxed_h
            )
            + "."
        )
    return ["- **Targets:** " + "; ".join(summary) + ".", *lines]


def markdown(
    results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any], server: str
) -> str:
    command = command_line("bench_postgres.py", args.argv)
    out = ["# Turnstile PostgreSQL backend vs pg_advisory_lock vs a naive polling lock row", ""]
    out += machine_lines(info, command)
    out += [f"- server: {server}", "", "Contenders:", ""]
    out += [f"- **{c['label']}** — {c['note']}" for c in results["contenders"]]
    out += ["", "## Interpretation", ""]
    out += interpretation(results)
    out += uncontended_section(results["uncontended"], BASELINE)
    for group in _groups(results["handover"]):
        h = group[0]
        out += [
            f"## Handover: {h.processes - 1} waiters ({h.processes} processes), one name, "
            f"{fmt(h.hold_ms, 0)} ms critical sections",
            "",
            "Gap = end of one critical section to the start of the next one in *another* "
            "process (includes the release call and the wake-up). FIFO violations by call "
            "time = grants to a process that called acquire more than "
            f"{fmt(h.fifo_tolerance_ms, 0)} ms after another process still waiting; certain "
            "= grants that overtook a request the lock had confirmed in line before the "
            "overtaker called acquire (`-`: the lock never confirms). "
            "*transactions / grant*: transaction ids the server assigned during the run "
            "divided by the grants (every Turnstile call and every naive-row attempt is one "
            "writing transaction; pg_advisory_lock writes none). Slow locks stop "
            "starting rounds after the time budget, hence fewer grants."
            + handover_trials_note(group),
            "",
            handover_table(group, BASELINE, counters=True),
            "",
        ]
    for group in results["webhooks"]:
        r = group[0]
        out += [
            f"## Webhooks: {r.scenario}, {r.workers} workers, {fmt(r.work_ms, 0)} ms of work",
            "",
            f"Ideal makespan {fmt(r.ideal_s, 3)} s. Efficiency = ideal / makespan; *perfect "
            "FIFO lock* = the efficiency of a zero-overhead strictly-FIFO lock on the same "
            "arrivals; *vs perfect* = efficiency / that. Out of order = webhooks that ran "
            "before an earlier-arrived webhook of the same order.",
            "",
            webhook_table(group, BASELINE, counters=True),
            "",
        ]
    return "\n".join(out)


class PostgresBench(LockBench):
    name = "postgres"
    description = (__doc__ or "").split("\n")[0]
    packages = ("turnstile", "psycopg", "psycopg-pool")
    requires = (("psycopg", "pip install 'turnstile-locks[postgres]'"),)
    tmpdir_help = "accepted for the harness tests; unused"
    trials_option = False  # fixed: 9 uncontended trials, 7 of each webhook feed
    server = ""

    def options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--url",
            default=os.environ.get("TURNSTILE_BENCH_POSTGRES_URL"),
            help="an existing server (default: start a throwaway cluster)",
        )
        parser.add_argument(
            "--waiters",
            type=lambda s: [int(x) for x in s.split(",")],
            default=[2, 8, 32],
            help="handover sizes (default 2,8,32)",
        )
        super().options(parser)

    @contextlib.contextmanager
    def target(self, args: argparse.Namespace, info: dict[str, Any]) -> Iterator[tuple[str, str]]:
        import psycopg

        schema = f"bench_{secrets.token_hex(4)}"
        with contextlib.ExitStack() as stack:
            if args.url:
                url = args.url
                self.server = "given with --url (shared: counters include others' traffic)"
                stack.callback(_drop_schema, url, schema)
            else:
                url = stack.enter_context(throwaway_postgres())
                self.server = (
                    "a throwaway cluster started by the script (initdb, default settings, "
                    "fsync on, synchronous_commit on, on the machine's temporary directory)"
                )
            with psycopg.connect(url, autocommit=True) as conn:
                version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            info["versions"]["PostgreSQL"] = version
            yield url, schema

    def run(self, args: argparse.Namespace, target: tuple[str, str]) -> dict[str, Any]:
        url, schema = target
        main = contenders(url, schema)
        quick = args.quick
        sizes = Sizes(
            # On a shared virtual machine a trial's rate swings by a third from one second to
            # the next (the same lock's trials 2,364 to 4,022 per second in one run): each
            # trial runs about a second, and the median is of nine, interleaved over the
            # contenders so the drift meets them alike.
            iterations=100 if quick else 3000,
            seconds=0.5 if quick else 3.0,
            trials=1 if quick else 9,
            waiters=[2] if quick else args.waiters,
            rounds=lambda processes: 4 if quick else max(6, 200 // processes),
            handover_seconds=2.5 if quick else 20.0,
            # The demo's five webhooks take 60 ms: one trial is mostly noise, so take the
            # median of several (interleaved over the contenders); the random feed's
            # trials vary by a few points too.
            webhook_trials=(1,) if quick else (7, 7),
            handover_trials=1 if quick else 3,
        )
        extra = uncontended_contenders(url, schema)
        uncontended = [c for c in main if c.label not in ("naive row (50 ms poll)", NOTIFY_ROW)]
        uncontended[3:3] = extra  # after the relaxed row, before pg_advisory_lock
        hooks = webhook_contenders(url, schema)
        locks = self.run_locks(
            args, main, sizes, uncontended=uncontended, webhooks=[*main, *hooks]
        )
        return {
            "contenders": [{"label": c.label, "note": c.note} for c in main + extra + hooks],
            "idle": idle_probe(url, schema, args.work, rounds=10 if quick else 40),
            **locks,
        }

    def markdown(
        self, results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]
    ) -> str:
        return markdown(results, args, info, self.server)

    def sane(self, results: dict[str, Any]) -> bool:
        return no_overlaps(results)


def _drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    sys.exit(main(PostgresBench()))
