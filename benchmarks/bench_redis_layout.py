#!/usr/bin/env python3
"""The prototype of Turnstile's Redis key layout 2 beside Turnstile and python-redis-lock.

    python benchmarks/bench_redis_layout.py          # full run: results/redis-layout.md
    python benchmarks/bench_redis_layout.py --quick  # tiny sizes, < 60 s, writes nothing (CI)

Issue 13 asks for at most 12 Redis commands per hand-over (those inside scripts included);
Turnstile's layout 1 sent 21. ``turnstile_bench/layout_prototype.py`` is the layout measured
before Turnstile adopted it as layout 2, for a plain lock only: holders in one field of the
name's hash, the line as one sorted set whose members carry the waiting entries (dead
waiters dropped when they reach the front), and the grant published on the waiter's own
channel. This script measures it side by side in one run with Turnstile as it is (bare
``acquire()`` / ``release()``, like the prototype, which has no renewer; layout 2, with
everything the prototype leaves out) and python-redis-lock: what the rest of the lock
machine costs on the same layout. Commands per
grant (``INFO commandstats``), hand-over latency at 2, 8 and 32 waiters, uncontended
acquire + release (with redis-py's ``Lock`` as the base), and the webhook scenarios.

It starts its own ``redis-server`` (found on PATH) on a free port in a temporary folder, so
the counters hold this run's commands only; ``--redis-url`` uses another server instead (keys
under a fresh prefix, deleted afterwards; the prototype's function library is deleted too).
Exit status 77 without a redis-server.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turnstile_bench import (
    Contender,
    LockBench,
    Sizes,
    TurnstileLock,
    by_waiters,
    command_line,
    fmt,
    handover_table,
    machine_lines,
    main,
    no_overlaps,
    uncontended_section,
    webhook_table,
)
from turnstile_bench.adapters import CommandCounter, PythonRedisLock, RedisPyLock
from turnstile_bench.layout_prototype import LayoutPrototypeLock, delete_library
from turnstile_bench.servers import delete_redis_keys, own_redis, scratch_folder
from turnstile_bench.workers import progress

BARE = "turnstile redis, no renewer"
PROTO = "layout prototype"
PROTO_FIELDS = "layout prototype, waiter fields"
PRL = "python-redis-lock"
REDIS_PY = "redis-py Lock"
TARGET_COMMANDS = 12


def contenders(redis_url: str, prefix: str, counted: bool) -> tuple[list[Contender], Contender]:
    # PUBLISH: the prototype's wake-up
    probe = CommandCounter(redis_url, also=("PUBLISH",)) if counted else None
    main = [
        Contender(
            BARE,
            functools.partial(TurnstileLock, f"{redis_url}?prefix={prefix}t:", renew=False),
            "Turnstile as it is: bare `acquire()` / `release()`, no background renewal",
            probe,
        ),
        Contender(
            PROTO,
            functools.partial(LayoutPrototypeLock, redis_url, f"{prefix}p:"),
            "turnstile_bench/layout_prototype.py: a plain lock on the proposed layout, "
            "grants published on the waiter's channel",
            probe,
        ),
        Contender(
            PROTO_FIELDS,
            functools.partial(
                LayoutPrototypeLock, redis_url, f"{prefix}f:", waiter_fields=True
            ),
            "the same with a field per waiter in the name's hash (`w:<holder>`: its entry "
            "in line), which lets a holder leave the line from another process by name "
            "alone: written in the join's HSET, dropped with one HDEL in the hand-over",
            probe,
        ),
        Contender(
            PRL,
            functools.partial(PythonRedisLock, redis_url, prefix),
            "`redis_lock.Lock(r, name, expire=30)`: BLPOP signal",
            probe,
        ),
    ]
    base = Contender(
        REDIS_PY,
        functools.partial(RedisPyLock, redis_url, prefix),
        "`redis.lock(name, timeout=30)` (uncontended only: the base of the ratio)",
        probe,
    )
    return main, base


def interpretation(results: dict[str, Any]) -> list[str]:
    lines = []
    groups = by_waiters(results["handover"])
    counts = []
    for waiters, by in groups.items():
        proto, bare, prl = by.get(PROTO), by.get(BARE), by.get(PRL)
        if proto is None or bare is None or prl is None:
            continue
        pc = proto.per_grant.get("Redis commands", math.nan)
        bc = bare.per_grant.get("Redis commands", math.nan)
        counts.append(pc)
        fields = by.get(PROTO_FIELDS)
        with_fields = ""
        if fields is not None:
            fc = fields.per_grant.get("Redis commands", math.nan)
            counts.append(fc)
            with_fields = (
                f" ({fmt(fc)} with waiter fields, hand-over p50 {fmt(fields.gap_p50_ms)} ms, "
                f"certain FIFO violations {fields.certain_fifo_violations}, overlaps "
                f"{fields.overlaps})"
            )
        lines.append(
            f"- **{waiters} waiters.** Commands per grant: prototype {fmt(pc)}{with_fields}, "
            f"Turnstile {fmt(bc)}, python-redis-lock "
            f"{fmt(prl.per_grant.get('Redis commands', math.nan))}. "
            f"Hand-over p50: prototype {fmt(proto.gap_p50_ms)} ms, Turnstile "
            f"{fmt(bare.gap_p50_ms)} ms, python-redis-lock {fmt(prl.gap_p50_ms)} ms "
            f"(it handed {prl.handovers - prl.to_other} of {prl.handovers} successions back to "
            f"the releaser, which are not in its figure). Certain FIFO violations: prototype "
            f"{proto.certain_fifo_violations}, Turnstile {bare.certain_fifo_violations}; "
            f"overlaps {proto.overlaps} and {bare.overlaps}."
        )
    if counts and not any(math.isnan(c) for c in counts):
        verdict = "within" if max(counts) <= TARGET_COMMANDS else "over"
        lines.append(
            f"- The prototype's most commands per grant, {fmt(max(counts))}, is {verdict} the "
            f"issue's {TARGET_COMMANDS}: a waiter's join (FCALL; inside, HMGET, TIME, ZADD, "
            "HSET), the holder's release (FCALL; inside, HMGET, TIME, ZPOPMIN, PUBLISH, HSET), "
            "and nothing on the waiter's side (the grant arrives on its subscription): 11; "
            "with a field per waiter, its entry written in the join's HSET and dropped by one "
            "HDEL in the release: 12. The keys' expiry is moved 300 s ahead at a time, as "
            "Turnstile's is, so it is not in every step."
        )
    unc = {r.label: r for r in results["uncontended"]}
    if PROTO in unc and REDIS_PY in unc and BARE in unc:
        base = unc[REDIS_PY].ops_per_s
        lines.append(
            f"- **Uncontended** acquire + release: prototype {unc[PROTO].ops_per_s:,.0f}/s "
            f"({fmt(unc[PROTO].ops_per_s / base)}x redis-py `Lock`), Turnstile "
            f"{unc[BARE].ops_per_s:,.0f}/s ({fmt(unc[BARE].ops_per_s / base)}x), redis-py "
            f"{base:,.0f}/s. The idle-name steps of both are HMGET, TIME, HSET each "
            "(Turnstile's release has a PING ahead of it)."
        )
    for group in results["webhooks"]:
        by = {r.label: r for r in group}
        if PROTO in by and BARE in by and PRL in by:
            lines.append(
                f"- **Webhooks, {group[0].scenario}**: vs the perfect-FIFO bound, prototype "
                f"{fmt(by[PROTO].vs_bound)}, Turnstile {fmt(by[BARE].vs_bound)}, "
                f"python-redis-lock {fmt(by[PRL].vs_bound)}."
            )
    lines.append(
        "- What the prototype leaves out, and Turnstile's layout 2 has (docs/redis.md): "
        "priorities (a rank as the score; a join behind a waiter of negative priority "
        "checks for a rank collision and reads its position with ZRANK), callback waiters "
        "and pending deliveries, semaphore groups, `status()`, the sweep of lapsed entries "
        "(one read of the line once a lower bound on their expiries has passed, where the "
        "prototype drops a dead waiter only when it reaches the front, so positions counted "
        "it), and an index by holder for the entries that may be asked for by holder alone "
        "(tickets, named holders: one HDEL more per hand-over). Both rewrite all holders in "
        "one field on every step: nothing for a lock, work in the limit for a semaphore "
        "with thousands of holders."
    )
    return lines


def markdown(results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]) -> str:
    command = command_line("bench_redis_layout.py", args.argv)
    out = ["# Redis layout 2 for locks: its prototype beside Turnstile", ""]
    out += machine_lines(info, command)
    out += [
        f"- Redis: {info.get('redis_server', '?')}"
        + (" (a server of the benchmark's own, no persistence)" if not args.redis_url else ""),
        "",
        "**A prototype, not Turnstile**: see benchmarks/turnstile_bench/layout_prototype.py "
        "for what it keeps and what it leaves out. Contenders (same server, one name per run):",
        "",
    ]
    out += [f"- **{c['label']}** — {c['note']}" for c in results["contenders"]]
    out += ["", "## Interpretation", ""]
    out += interpretation(results)
    out += uncontended_section(results["uncontended"], REDIS_PY)
    for waiters, by in by_waiters(results["handover"]).items():
        group = list(by.values())
        h = group[0]
        out += [
            f"## Handover: {waiters} waiters ({h.processes} processes), one name, "
            f"{fmt(h.hold_ms, 0)} ms critical sections",
            "",
            "Gap = end of one critical section to the start of the next one in *another* "
            "process. Counters: `INFO commandstats` differences over the run, per grant "
            "(commands inside scripts and functions included).",
            "",
            handover_table(group, PRL, counters=True),
            "",
        ]
    for group in results["webhooks"]:
        out += [
            f"## Webhooks: {group[0].scenario}, {group[0].workers} workers",
            "",
            webhook_table(group, PRL),
            "",
        ]
    return "\n".join(out)


class RedisLayoutBench(LockBench):
    name = "redis-layout"
    description = (__doc__ or "").split("\n")[0]
    packages = ("turnstile", "redis", "hiredis", "python-redis-lock")
    requires = (
        ("redis", "pip install -e '.[redis]' and the bench group (scripts/dev.py)"),
        ("redis_lock", "the bench dependency group (scripts/dev.py)"),
    )
    tmpdir_help = "where the benchmark's own redis-server keeps its files"

    @property
    def script(self) -> str:
        return "bench_redis_layout.py"

    def options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--redis-url", help="use this Redis instead of starting one")
        super().options(parser)

    @contextlib.contextmanager
    def target(self, args: argparse.Namespace, info: dict[str, Any]) -> Iterator[tuple[str, str]]:
        import redis

        prefix = f"bench-{secrets.token_hex(4)}:"
        with contextlib.ExitStack() as stack:
            if args.redis_url:
                redis_url = args.redis_url
                stack.callback(delete_redis_keys, redis_url, f"{prefix}*", f"lock:{prefix}*")
            else:
                folder = stack.enter_context(
                    scratch_folder(args.tmpdir, prefix="turnstile-bench-redis-layout-")
                )
                redis_url = stack.enter_context(own_redis(folder))
            client = stack.enter_context(contextlib.closing(redis.Redis.from_url(redis_url)))
            stack.callback(delete_library, client)
            info["redis_server"] = "Redis " + str(client.info("server")["redis_version"])
            yield redis_url, prefix

    def run(self, args: argparse.Namespace, target: tuple[str, str]) -> dict[str, Any]:
        redis_url, prefix = target
        quick = args.quick
        main_contenders, base = contenders(redis_url, prefix, not args.redis_url)
        sizes = Sizes(
            iterations=100 if quick else 2000,
            seconds=0.5 if quick else 3.0,
            trials=1 if quick else 5,
            waiters=(2,) if quick else (2, 8, 32),
            rounds=lambda processes: 3 if quick else max(8, 240 // processes),
            handover_seconds=2.0 if quick else 20.0,
            webhook_trials=(1,) if quick else (args.trials, args.trials),
        )
        progress("prototype layout vs Turnstile vs python-redis-lock")
        return {
            "contenders": [{"label": c.label, "note": c.note} for c in [*main_contenders, base]],
            **self.run_locks(args, main_contenders, sizes, uncontended=[*main_contenders, base]),
        }

    def markdown(
        self, results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]
    ) -> str:
        return markdown(results, args, info)

    def sane(self, results: dict[str, Any]) -> bool:
        """Neither Turnstile nor the prototype may let two critical sections overlap."""
        return no_overlaps(results, only="turnstile", rates=False) and no_overlaps(
            results, only="layout", rates=False
        )


if __name__ == "__main__":
    sys.exit(main(RedisLayoutBench()))
