#!/usr/bin/env python3
"""Scale: long lines, many names, and a Redis Cluster against one server.

    python benchmarks/bench_scale.py            # full run, writes benchmarks/results/scale.md
    python benchmarks/bench_scale.py --quick    # tiny sizes, writes no file (CI)

Stores: a ``redis-server`` of the script's own (so ``INFO commandstats`` and ``INFO cpu``
count only this run), a throwaway PostgreSQL cluster (initdb; durable commits) or, when none
can be started, ``$TURNSTILE_TEST_POSTGRES_URL`` in a schema of the run's own (then no CPU
figure), and a SQLite file in a scratch folder. Redis Cluster: three masters of the script's
own (``scripts/servers.py``).

For every store, through ``turnstile.aio`` in this one process:

* **A line of W waiters on one name** (W = 2 and ``--waiters``, 10,000 by default). A holder
  takes the name; W waiters join its line with ``try_acquire`` (the documented ask-once
  call; ``wait_ttl`` 600 s, so they need no heartbeats and stay in line without a process
  each: these are *parked* waiters, not 10,000 processes). Then K hand-overs: release the
  holder, claim the head of the line (it was granted by the release), and a new waiter
  joins at the back, so the line stays W long. Reported per hand-over: latency (release +
  claim) p50/p99 and store work (Redis commands, scripts' inner commands included;
  PostgreSQL transactions and tuples written). Memory per waiting entry: Redis ``MEMORY
  USAGE`` of the name's keys, PostgreSQL the pages holding live rows of the schema's tables
  plus their indexes and TOAST, SQLite pages in use, after the line formed minus before,
  divided by W.
* **Held names**: H names held at once (bytes per held name, the same way), then released.
* **Names used once**: U names each acquired and released once (``--concurrency`` at a
  time); ops/s and ops per CPU-second of the server (Redis ``INFO cpu``; PostgreSQL: every
  process of the throwaway cluster, from ``/proc``); then the keys under the run's prefix /
  rows in the schema's tables / rows in the SQLite file, which must be what they were
  before (nothing left behind).
* **Cluster vs one server**: the same names-used-once load from two processes against the
  single server and the three-master cluster; keys per master while names are held.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import os
import secrets
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turnstile_bench import (
    Bench,
    Contender,
    TurnstileLock,
    command_line,
    machine_lines,
    main,
    markdown_table,
    percentile,
    run_workers,
)
from turnstile_bench.adapters import cluster_cpu
from turnstile_bench.plots import Figure
from turnstile_bench.servers import Unavailable, _starter, own_redis, scratch_folder
from turnstile_bench.workers import progress

from turnstile._core.urls import redact

TTL = 600.0


# -- the stores' meters ------------------------------------------------------------------------
class Meter:
    """What a store lets us count: work (a dict of counters), memory (bytes of the run's
    data), leftovers (keys or rows of the run's), CPU seconds of the server (NaN: unknown)."""

    def work(self) -> dict[str, float]:
        return {}

    def memory(self) -> float:
        return float("nan")

    def leftovers(self) -> tuple[int, int]:
        """(live entries: holders, waiters, wake-ups, and any key without an expiry; name
        records the store keeps for a while for the fencing counter)."""
        return 0, 0

    def cpu(self) -> float:
        return float("nan")


class RedisMeter(Meter):
    def __init__(self, server: str, prefix: str, nodes: list[str] | None = None) -> None:
        import redis

        self.prefix = prefix
        self.clients = [redis.Redis.from_url(u) for u in (nodes or [server])]

    def work(self) -> dict[str, float]:
        total = 0.0
        for c in self.clients:
            stats = c.info("commandstats")
            total += sum(float(v["calls"]) for k, v in stats.items()
                         if k not in ("cmdstat_info", "cmdstat_scan", "cmdstat_memory"))
        return {"Redis commands": total}

    def _keys(self) -> list[tuple[Any, bytes]]:
        return [(c, k) for c in self.clients
                for k in c.scan_iter(match=f"{self.prefix}*", count=1000)]

    def memory(self) -> float:
        return float(sum(c.memory_usage(k, samples=0) or 0 for c, k in self._keys()))

    def leftovers(self) -> tuple[int, int]:
        live = records = 0
        for c, k in self._keys():
            if k.endswith(b":d") and c.ttl(k) > 0:
                records += 1  # the name's hash: token counter, expires an hour after use
            elif k.endswith(b":l") and c.ttl(k) > 0 and c.zrange(k, 0, -1) == [b"~"]:
                records += 1  # an empty line: its sentinel only, expiring with the hash
            else:
                live += 1
        return live, records

    def per_node(self) -> list[int]:
        return [sum(1 for _ in c.scan_iter(match=f"{self.prefix}*", count=1000))
                for c in self.clients]

    def cpu(self) -> float:
        total = 0.0
        for c in self.clients:
            info = c.info("cpu")
            total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        return total

    def close(self) -> None:
        for c in self.clients:
            c.close()


class PostgresMeter(Meter):
    def __init__(self, server: str, schema: str, data: Path | None) -> None:
        import psycopg

        self.conn = psycopg.connect(server, autocommit=True)
        self.schema = schema
        self.data = data

    def _tables(self) -> list[str]:
        rows = self.conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (self.schema,)
        ).fetchall()
        return [r[0] for r in rows]

    def work(self) -> dict[str, float]:
        # A backend reports its statistics when it goes idle, at most once a second; one
        # that reported less than a second ago waits for 10 s of idleness (PostgreSQL 15+:
        # PGSTAT_MIN_INTERVAL, PGSTAT_IDLE_INTERVAL). With a shorter pause the rows a
        # phase wrote were counted in the next one (0.04 rows per hand-over at 2 waiters,
        # 8.2 at 10,000, in the run of 2026-11-26 08:14).
        time.sleep(10.5)
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        xid = self.conn.execute("SELECT txid_current()").fetchone()[0]  # type: ignore[index]
        tup = self.conn.execute(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
            " WHERE schemaname = %s", (self.schema,)
        ).fetchone()[0]  # type: ignore[index]
        return {"PostgreSQL transactions": float(xid), "rows written": float(tup)}

    def memory(self) -> float:
        # The pages that hold a live row of each table (a page with one live row counts
        # whole, so fillfactor's free space and dead rows beside live ones are in), plus
        # the table's indexes and TOAST. Not the table files' sizes: a names table keeps
        # empty pages from its creation (schema version 19, so that the planner reads it
        # through the key's index), and names held in them would not grow the file.
        total = 0
        for t in self._tables():
            ident = f'"{self.schema}"."{t}"'
            row = self.conn.execute(
                "SELECT (SELECT count(DISTINCT (ctid::text::point)[0]) FROM " + ident + ")"
                " * current_setting('block_size')::bigint + pg_indexes_size(c.oid)"
                " + coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0)"
                " FROM pg_class c WHERE c.oid = %s::regclass", (ident,)
            ).fetchone()
            total += int(row[0])  # type: ignore[index]
        return float(total)

    def _count(self, table: str) -> int:
        return int(self.conn.execute(f'SELECT count(*) FROM "{self.schema}"."{table}"')
                   .fetchone()[0])  # type: ignore[index]

    def leftovers(self) -> tuple[int, int]:
        tables = self._tables()
        live = sum(self._count(t) for t in ("holders", "waiters") if t in tables)
        return live, self._count("names") if "names" in tables else 0

    def cpu(self) -> float:
        if self.data is None:
            return float("nan")
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        return sum(cluster_cpu(postmaster).values())

    def close(self) -> None:
        self.conn.close()


class SQLiteMeter(Meter):
    def __init__(self, path: Path) -> None:
        self.path = path

    def _conn(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def memory(self) -> float:
        with contextlib.closing(self._conn()) as c:
            pages = c.execute("PRAGMA page_count").fetchone()[0]
            free = c.execute("PRAGMA freelist_count").fetchone()[0]
            size = c.execute("PRAGMA page_size").fetchone()[0]
        return float((pages - free) * size)

    def leftovers(self) -> tuple[int, int]:
        with contextlib.closing(self._conn()) as c:
            def count(t: str) -> int:
                return int(c.execute(f"SELECT count(*) FROM {t}").fetchone()[0])

            return (count("turnstile_holders") + count("turnstile_waiters"),
                    count("turnstile_names"))


# -- the measurements --------------------------------------------------------------------------
@dataclass
class LineResult:
    store: str
    waiters: int
    grants: int
    fill_s: float
    p50_ms: float
    p99_ms: float
    per_grant: dict[str, float]
    bytes_per_waiter: float


@dataclass
class NamesResult:
    store: str
    held: int
    bytes_per_held_name: float
    bytes_per_released_name: float  # the record kept for the fencing counter, until it expires
    used_once: int
    ops_per_s: float  # acquire + release pairs per second
    server_cpu_s: float
    pairs_per_cpu_s: float
    live_before: int  # holders and waiters (and Redis keys without an expiry)
    live_after: int
    records_before: int  # name records kept for the fencing counter (they expire)
    records_after: int
    per_pair: dict[str, float] = field(default_factory=dict)


async def _bounded(n: int, concurrency: int, fn: Callable[[int], Any]) -> None:
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            await fn(i)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))


async def measure_line(store: str, url: str, meter: Meter, waiters: int, grants: int,
                       concurrency: int) -> LineResult:
    import turnstile.aio

    progress(f"  line of {waiters:,} waiters on {store}")
    async with await turnstile.aio.connect(url) as client:
        lock = client.lock(f"scale-{secrets.token_hex(3)}:line", ttl=TTL)
        holder = f"h-{secrets.token_hex(4)}"
        held = await lock.try_acquire(holder, wait_ttl=TTL)
        assert held.acquired
        mem0 = meter.memory()
        ids = [f"w{i}-{secrets.token_hex(4)}" for i in range(waiters)]
        started = time.monotonic()

        async def join(i: int) -> None:
            ticket = await lock.try_acquire(ids[i], wait_ttl=TTL)
            assert not ticket.acquired

        await _bounded(waiters, concurrency, join)
        fill = time.monotonic() - started
        mem1 = meter.memory()
        status = await lock.status()
        line = collections.deque(w.holder for w in sorted(status.waiters, key=lambda w: w.position))
        if len(line) != waiters:
            raise RuntimeError(f"{store}: {len(line)} waiters in line, expected {waiters}")
        lease = held.lease
        assert lease is not None
        work0 = meter.work()
        latencies = []
        for _ in range(grants):
            head = line.popleft()
            t0 = time.monotonic()
            await lease.release()
            ticket = await lock.try_acquire(head, wait_ttl=TTL)
            t1 = time.monotonic()
            if not ticket.acquired or ticket.lease is None:
                raise RuntimeError(f"{store}: the head of the line was not granted")
            lease = ticket.lease
            latencies.append(t1 - t0)
            newcomer = f"n-{secrets.token_hex(5)}"
            await lock.try_acquire(newcomer, wait_ttl=TTL)
            line.append(newcomer)
        work1 = meter.work()
        await lease.release()

        async def leave(i: int) -> None:  # the line leaves: nothing stays for the next phase
            await lock.release(line[i])

        await _bounded(len(line), concurrency, leave)
    return LineResult(
        store, waiters, grants, fill,
        percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000,
        {k: (work1[k] - work0.get(k, 0.0)) / grants for k in work1},
        (mem1 - mem0) / waiters,
    )


async def measure_names(store: str, url: str, meter: Meter, held: int, used: int,
                        concurrency: int) -> NamesResult:
    import turnstile.aio

    progress(f"  {held:,} names held, {used:,} names used once on {store}")
    tag = secrets.token_hex(3)
    async with await turnstile.aio.connect(url) as client:
        warm = await client.lock(f"scale-{tag}:warm", ttl=TTL).acquire_nowait()
        await warm.release()
        before = meter.leftovers()
        mem0 = meter.memory()
        leases: list[Any] = [None] * held

        async def hold(i: int) -> None:
            leases[i] = await client.lock(f"scale-{tag}:held:{i}", ttl=TTL).acquire_nowait()

        await _bounded(held, concurrency, hold)
        mem1 = meter.memory()

        async def free(i: int) -> None:
            await leases[i].release()

        await _bounded(held, concurrency, free)
        mem2 = meter.memory()  # what the released names still take (their records)
        work0, cpu0 = meter.work(), meter.cpu()
        started = time.monotonic()

        async def once(i: int) -> None:
            lease = await client.lock(f"scale-{tag}:once:{i}", ttl=TTL).acquire_nowait()
            await lease.release()

        await _bounded(used, concurrency, once)
        elapsed = time.monotonic() - started
        cpu = meter.cpu() - cpu0
        work1 = meter.work()
        after = meter.leftovers()
    return NamesResult(
        store, held, (mem1 - mem0) / held, (mem2 - mem0) / held, used, used / elapsed, cpu,
        used / cpu if cpu else 0.0,
        before[0], after[0], before[1], after[1],
        {k: (work1[k] - work0.get(k, 0.0)) / used for k in work1},
    )


def _cluster_job(adapter: Any, args: tuple[str, int, int], go: float) -> int:
    url, count, concurrency = args

    async def run() -> int:
        import turnstile.aio

        tag = f"{os.getpid()}-{secrets.token_hex(3)}"
        async with await turnstile.aio.connect(url) as client:
            async def once(i: int) -> None:
                lease = await client.lock(f"scale-{tag}:c:{i}", ttl=TTL).acquire_nowait()
                await lease.release()

            await _bounded(count, concurrency, once)
        return count

    return asyncio.run(run())


def measure_spread(label: str, url: str, meter: RedisMeter, used: int, held: int,
                   concurrency: int) -> dict[str, Any]:
    progress(f"  names used once from 2 processes on {label}")
    contender = Contender(label, functools.partial(TurnstileLock, url))
    cpu0 = meter.cpu()
    started = time.monotonic()
    run = run_workers(contender, _cluster_job, [(url, used // 2, concurrency)] * 2, timeout=900)
    elapsed = max(time.monotonic() - started, 1e-9)
    # go -> all reported; spawn time is before go, so use the workers' own clocks
    wall = time.monotonic() - min(run.go_times)
    cpu = meter.cpu() - cpu0

    async def hold_some() -> list[int]:
        import turnstile.aio

        async with await turnstile.aio.connect(url) as client:
            # Keys per master that the held names add (name records of the names used once
            # above are still there, for an hour: not counted).
            before = meter.per_node()
            leases = [await client.lock(f"scale-spread-{i}", ttl=TTL).acquire_nowait()
                      for i in range(held)]
            spread = [n - b for n, b in zip(meter.per_node(), before, strict=True)]
            for lease in leases:
                await lease.release()
        return spread

    spread = asyncio.run(hold_some())
    return {"label": label, "used": sum(run.results), "ops_per_s": sum(run.results) / wall,
            "server_cpu_s": cpu, "pairs_per_cpu_s": sum(run.results) / cpu if cpu else 0.0,
            "keys_per_node": spread, "held": held, "elapsed_s": elapsed}


# -- servers -----------------------------------------------------------------------------------
@contextlib.contextmanager
def postgres_target(quick: bool) -> Iterator[tuple[str, Path | None, str]]:
    """(server URL, data folder or None, how it was had)."""
    starter = _starter()
    server = None
    if not quick:
        with contextlib.suppress(starter.Unavailable):
            server = starter.PostgresServer({"max_connections": 200, "shared_buffers": "64MB",
                                             "fsync": "on", "synchronous_commit": "on"})
    if server is not None:
        try:
            server.start()
            yield server.url, server.data, "a throwaway cluster of the script's own (fsync on)"
        finally:
            server.close()
        return
    env = os.environ.get("TURNSTILE_TEST_POSTGRES_URL")
    if not env:
        raise Unavailable("no PostgreSQL: cannot start one, $TURNSTILE_TEST_POSTGRES_URL unset")
    yield env, None, "$TURNSTILE_TEST_POSTGRES_URL (shared: no CPU figure)"


@contextlib.contextmanager
def pg_schema(server: str) -> Iterator[str]:
    import psycopg

    schema = f"bench_scale_{secrets.token_hex(4)}"
    try:
        yield schema
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def with_option(url: str, option: str) -> str:
    return url + ("&" if "?" in url else "?") + option


class ScaleBench(Bench):
    name = "scale"
    description = __doc__ or ""
    packages = ("turnstile", "redis", "psycopg")

    def options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--waiters", type=int, default=None, help="the long line (10000)")
        parser.add_argument("--grants", type=int, default=None, help="hand-overs timed (200)")
        parser.add_argument("--held", type=int, default=None, help="names held at once (10000)")
        parser.add_argument("--used", type=int, default=None, help="names used once (100000)")
        parser.add_argument("--concurrency", type=int, default=32)
        parser.add_argument("--stores", default="redis,postgres,sqlite,cluster")

    def run(self, args: argparse.Namespace, target: None) -> dict[str, Any]:
        q = args.quick
        waiters = args.waiters or (40 if q else 10_000)
        grants = args.grants or (10 if q else 200)
        held = args.held or (40 if q else 10_000)
        used = args.used or (200 if q else 100_000)
        stores = [s.strip() for s in args.stores.split(",")]
        lines: list[LineResult] = []
        names: list[NamesResult] = []
        spread: list[dict[str, Any]] = []
        notes: dict[str, str] = {}
        with contextlib.ExitStack() as stack:
            folder = stack.enter_context(scratch_folder(args.tmpdir, "turnstile-bench-scale-"))
            targets: list[tuple[str, str, Meter]] = []
            if "sqlite" in stores:
                path = folder / "scale.db"
                targets.append(("sqlite", f"sqlite:///{path}", SQLiteMeter(path)))
            redis_url = None
            if "redis" in stores or "cluster" in stores:
                try:
                    redis_url = stack.enter_context(own_redis(folder))
                except Unavailable as exc:
                    notes["redis"] = str(exc)
            if redis_url and "redis" in stores:
                prefix = f"bs{secrets.token_hex(3)}:"
                meter = RedisMeter(redis_url, prefix)
                stack.callback(meter.close)
                targets.append(("redis", with_option(redis_url, f"prefix={prefix}"), meter))
            if "postgres" in stores:
                try:
                    server, data, how = stack.enter_context(postgres_target(q))
                    notes["postgres"] = how
                    schema = stack.enter_context(pg_schema(server))
                    pmeter = PostgresMeter(server, schema, data)
                    stack.callback(pmeter.close)
                    targets.append(("postgres", with_option(server, f"schema={schema}"), pmeter))
                except Unavailable as exc:
                    notes["postgres"] = str(exc)
            for store, url, meter in targets:
                for w in (2, waiters):
                    lines.append(asyncio.run(
                        measure_line(store, url, meter, w, grants, args.concurrency)))
                names.append(asyncio.run(
                    measure_names(store, url, meter, held, used, args.concurrency)))
            if redis_url and "cluster" in stores:
                try:
                    spread = self._cluster(stack, folder, redis_url, used, args.concurrency, q)
                except Unavailable as exc:
                    notes["cluster"] = str(exc)
        if not targets:
            raise Unavailable("no store available: " + "; ".join(notes.values()))
        return {
            "command": command_line("bench_scale.py", args.argv, env=[
                f"TURNSTILE_TEST_POSTGRES_URL={redact(os.environ['TURNSTILE_TEST_POSTGRES_URL'])}"
            ] if notes.get("postgres", "").startswith("$") else []),
            "lines": lines, "names": names, "spread": spread, "notes": notes,
            "figures": self._figures(lines, names),
        }

    def _cluster(self, stack: contextlib.ExitStack, folder: Path, single: str, used: int,
                 concurrency: int, quick: bool) -> list[dict[str, Any]]:
        starter = _starter()
        try:
            cluster = stack.enter_context(starter.redis_cluster(3, folder / "cluster"))
        except starter.Unavailable as exc:
            raise Unavailable(str(exc)) from exc
        out = []
        prefix = f"bc{secrets.token_hex(3)}:"
        m1 = RedisMeter(single, prefix)
        m3 = RedisMeter(cluster.url, prefix, [n.url for n in cluster.nodes])
        stack.callback(m1.close)
        stack.callback(m3.close)
        hold = 30 if quick else 3000
        out.append(measure_spread("one Redis server", with_option(single, f"prefix={prefix}"),
                                  m1, used // 2, hold, concurrency))
        out.append(measure_spread("Redis Cluster, 3 masters",
                                  with_option(cluster.url, f"prefix={prefix}"), m3, used // 2,
                                  hold, concurrency))
        return out

    @staticmethod
    def _figures(lines: list[LineResult], names: list[NamesResult]) -> list[Figure]:
        stores = list(dict.fromkeys(r.store for r in lines))
        sizes = sorted({r.waiters for r in lines})
        by = {(r.store, r.waiters): r for r in lines}
        return [
            Figure("line", "Hand-over p50 by waiters in line (ms, log scale; flat is the goal)",
                   "waiters in line", "ms", [f"{w:,}" for w in sizes],
                   {s: [by[(s, w)].p50_ms if (s, w) in by else float("nan") for w in sizes]
                    for s in stores}, logy=True),
            Figure("names", "Names used once: acquire + release per second", "",
                   "pairs/s", [r.store for r in names], {"pairs/s": [r.ops_per_s for r in names]}),
        ]

    def markdown(self, results: dict[str, Any], args: argparse.Namespace,
                 info: dict[str, Any]) -> str:
        lines, names, spread = results["lines"], results["names"], results["spread"]
        work_keys = sorted({k for r in lines for k in r.per_grant})
        out = ["# Scale benchmark", "", *machine_lines(info, results["command"]),
               "- the machine is shared with other jobs (up to 8 agents' test runs on 2 "
               "cores): compare rows of this run only; ratios are what count.",
               *[f"- {store}: {note}" for store, note in results["notes"].items()], "",
               "## One name, a line of W waiters", "",
               "Waiters are parked entries (`try_acquire` with `wait_ttl` 600 s) made by one "
               "asyncio process, not W processes; each timed hand-over is the holder's release "
               "plus the claim by the head of the line, and one newcomer joins at the back "
               "(its step is in the store work too), so the line stays W long.", "",
               markdown_table(
                   ["store", "waiters", "hand-overs", "line formed in s", "hand-over p50 ms",
                    "p99 ms", *[f"{k} / hand-over" for k in work_keys], "bytes / waiter"],
                   [[r.store, r.waiters, r.grants, r.fill_s, r.p50_ms, r.p99_ms,
                     *[r.per_grant.get(k, float("nan")) for k in work_keys],
                     r.bytes_per_waiter if r.waiters > 2 else float("nan")] for r in lines]),
               "", "## Names: held at once, then used once each", "",
               markdown_table(
                   ["store", "held at once", "bytes / held name", "bytes / released name",
                    "used once",
                    "acquire+release /s", "server CPU s", "pairs / CPU-second",
                    "live entries before", "after", "name records before", "after",
                    *[f"{k} / pair" for k in work_keys]],
                   [[r.store, r.held, r.bytes_per_held_name, r.bytes_per_released_name,
                     r.used_once, r.ops_per_s,
                     r.server_cpu_s, r.pairs_per_cpu_s, r.live_before, r.live_after,
                     r.records_before, r.records_after,
                     *[r.per_pair.get(k, float("nan")) for k in work_keys]] for r in names])]
        if spread:
            out += ["", "## Redis Cluster (3 masters) vs one server", "",
                    "Names used once from two processes (asyncio, "
                    f"{args.concurrency} at a time each); then {spread[0]['held']:,} names "
                    "held at once, and the keys they add on each master.", "",
                    markdown_table(
                        ["target", "names", "acquire+release /s", "server CPU s (all nodes)",
                         "pairs / CPU-second", f"keys per master, {spread[0]['held']:,} held"],
                        [[s["label"], s["used"], s["ops_per_s"], s["server_cpu_s"],
                          s["pairs_per_cpu_s"], " / ".join(map(str, s["keys_per_node"]))]
                         for s in spread])]
        out += ["", "## Reading the results", "", *reading(lines, names, spread)]
        return "\n".join(out)

    def sane(self, results: dict[str, Any]) -> bool:
        """Names used once leave nothing behind."""
        bad = [r for r in results["names"] if r.live_after != r.live_before]
        if bad:
            print("LEFTOVERS: " + ", ".join(r.store for r in bad), file=sys.stderr)
        return not bad


def reading(lines: list[LineResult], names: list[NamesResult],
            spread: list[dict[str, Any]]) -> list[str]:
    out = []
    by = {(r.store, r.waiters): r for r in lines}
    for store in dict.fromkeys(r.store for r in lines):
        small = by.get((store, 2))
        big = max((r for r in lines if r.store == store), key=lambda r: r.waiters)
        if small is None or big is small:
            continue
        work = "; ".join(f"{k} {big.per_grant[k]:.1f} vs {small.per_grant.get(k, 0):.1f}"
                         for k in big.per_grant)
        out.append(
            f"- **{store}**: hand-over p50 {big.p50_ms:.2f} ms with {big.waiters:,} waiters "
            f"against {small.p50_ms:.2f} ms with 2 ({big.p50_ms / small.p50_ms:.2f}x); store "
            f"work per hand-over {work or 'not counted'}; {big.bytes_per_waiter:,.0f} bytes per "
            "waiting entry.")
    for r in names:
        verdict = ("no holder, waiter or key without expiry left behind"
                   if r.live_after == r.live_before
                   else f"{r.live_after - r.live_before} live entries LEFT BEHIND")
        kept = r.records_after - r.records_before
        if kept:
            verdict += (f"; {kept:,} name records kept for the fencing counter ("
                        + {"redis": "a hash per name with an expiry an hour after its last use",
                           "postgres": "a `names` row per name, forgotten after a day idle"}
                        .get(r.store, "kept") + "), so not 0 right away")
        else:
            verdict += "; 0 name records"
        cpu = (f", {r.pairs_per_cpu_s:,.0f} pairs per server CPU-second "
               f"({2 * r.pairs_per_cpu_s:,.0f} operations per core-second)"
               if r.server_cpu_s == r.server_cpu_s and r.server_cpu_s > 0 else "")
        out.append(f"- **{r.store}, names**: {r.bytes_per_held_name:,.0f} bytes per held name; "
                   f"{r.used_once:,} names used once at {r.ops_per_s:,.0f} pairs/s{cpu}; "
                   f"{verdict}.")
    if len(spread) == 2:
        one, three = spread
        out.append(
            f"- **Cluster**: {three['ops_per_s']:,.0f} pairs/s on three masters against "
            f"{one['ops_per_s']:,.0f} on one server ({three['ops_per_s'] / one['ops_per_s']:.2f}"
            f"x); keys spread {' / '.join(map(str, three['keys_per_node']))} over the masters. "
            "On this 2-core machine the client processes and three servers share two cores, so "
            "the cluster cannot show more throughput here; what it shows is that names spread "
            "evenly over the slots, each pair served by one master (server CPU per pair "
            f"{1000 * three['server_cpu_s'] / three['used']:.3f} ms summed over the three "
            f"against {1000 * one['server_cpu_s'] / one['used']:.3f} ms: three servers' own "
            "upkeep, cluster bus included, on top of the same scripts).")
    return out


if __name__ == "__main__":
    sys.exit(main(ScaleBench()))
