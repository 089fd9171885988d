#!/usr/bin/env python3
"""Turnstile's keyed queue: the webhook scenario by queue vs by lock, and queue throughput
beside an established Python queue on the same Redis (RQ) and a plain ``SKIP LOCKED`` table
queue on the same PostgreSQL.

    python benchmarks/bench_queue.py            # full run, writes benchmarks/results/queue.md
    python benchmarks/bench_queue.py --quick    # tiny sizes, writes nothing (CI)
    python benchmarks/bench_queue.py --json

Stores: a temporary SQLite file always; Redis from ``--redis`` / ``$TURNSTILE_TEST_REDIS_URL``
and PostgreSQL from ``--postgres`` / ``$TURNSTILE_TEST_POSTGRES_URL`` when given (each run
uses its own key prefix / schema and deletes it afterwards).

Webhooks: K orders x E webhooks arrive in a seeded random order, ``--spacing`` apart. *By
lock* (the harness's scenario): W workers take the next webhook from a shared feed as it
arrives, then wait for their order's Turnstile lock. *By queue*: a receiver puts each webhook
into a queue keyed by its order as it arrives; W workers ``get`` the next deliverable one.
Reported: makespan, efficiency (ideal / makespan), order violations (a webhook that ran before
an earlier-arrived one of its order), worker time spent holding a webhook it could not start
(waiting for its turn), and arrival -> start latency.

Throughput: N messages already queued (keyless), W consumers get + ack as fast as they can:
messages/s. Latency: one producer puts M messages at a steady rate; put -> start p50/p99.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (
    SPAWN,
    Contender,
    Handled,
    LockAdapter,
    TurnstileLock,
    WebhookScenario,
    _webhook_job,
    ideal_makespan,
    machine_info,
    machine_lines,
    markdown_table,
    percentile,
    run_workers,
    to_json,
    webhook_metrics,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "queue.md"


# -- adapters (built in each worker process) ---------------------------------------------------
class TurnstileQueue(LockAdapter):
    """A Turnstile client and queue; acquire/release only warm it up (the harness calls them
    once on a private name before the start line)."""

    def __init__(self, url: str, name: str, visibility_timeout: float = 30.0) -> None:
        import turnstile

        self.client = turnstile.connect(url)
        self.q = self.client.queue(name, visibility_timeout=visibility_timeout, max_attempts=5)
        self.url = url

    def acquire(self, name: str) -> None:
        warm = self.client.queue(name)
        warm.put(0)
        m = warm.get(timeout=5)
        if m is not None:
            m.ack()

    def release(self) -> None:
        return None

    def put(self, payload: Any, key: str | None = None) -> None:
        self.q.put(payload, key=key)

    def take(self, timeout: float) -> tuple[Any, Any] | None:
        m = self.q.get(timeout=timeout)
        return None if m is None else (m.payload, m)

    def done(self, handle: Any) -> None:
        handle.ack()

    def close(self) -> None:
        self.client.close()


class SkipLockedQueue(LockAdapter):
    """The usual PostgreSQL table queue: ``DELETE ... WHERE id = (SELECT ... FOR UPDATE SKIP
    LOCKED LIMIT 1) RETURNING``, consumers woken by LISTEN/NOTIFY (NOTIFY per insert), in a
    schema of its own. No keys, no visibility timeout (a consumer's crash loses its message
    unless it keeps a transaction open), no cap."""

    def __init__(self, url: str, schema: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.schema = schema
        self.channel = f"q_{schema}"
        self.listen: Any = None

    def acquire(self, name: str) -> None:
        self.conn.execute("SELECT 1")

    def release(self) -> None:
        return None

    def put(self, payload: Any, key: str | None = None) -> None:
        import json

        self.conn.execute(
            f"WITH i AS (INSERT INTO {self.schema}.jobs (payload) VALUES (%s))"
            f" SELECT pg_notify('{self.channel}', '')",
            (json.dumps(payload),),
        )

    def _claim(self) -> Any:
        return self.conn.execute(
            f"DELETE FROM {self.schema}.jobs WHERE id = (SELECT id FROM {self.schema}.jobs"
            " ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING payload"
        ).fetchone()

    def take(self, timeout: float) -> tuple[Any, Any] | None:
        import psycopg

        if self.listen is None:
            self.listen = psycopg.connect(self.conn.info.dsn, autocommit=True)
            self.listen.execute(f"LISTEN {self.channel}")
        end = time.monotonic() + timeout
        while True:
            row = self._claim()
            if row is not None:
                return row[0], None
            left = end - time.monotonic()
            if left <= 0:
                return None
            for _ in self.listen.notifies(timeout=min(left, 1.0), stop_after=1):
                break

    def done(self, handle: Any) -> None:
        return None  # deleted when taken (no visibility timeout)

    def close(self) -> None:
        self.conn.close()
        if self.listen is not None:
            self.listen.close()


class RQQueue(LockAdapter):
    """RQ (``rq.SimpleWorker``: no fork per job) on the same Redis: enqueue a job; a consumer
    dequeues (BLPOP) and executes it with RQ's bookkeeping (job status, registries)."""

    def __init__(self, url: str, name: str) -> None:
        import redis
        import rq

        self.redis = redis.Redis.from_url(url)
        self.queue = rq.Queue(name, connection=self.redis)
        self.worker: Any = None

    def acquire(self, name: str) -> None:
        self.redis.ping()

    def release(self) -> None:
        return None

    def put(self, payload: Any, key: str | None = None) -> None:
        self.queue.enqueue("_queue_jobs.record", payload, result_ttl=0)

    def take(self, timeout: float) -> tuple[Any, Any] | None:
        import _queue_jobs
        from rq.worker import SimpleWorker

        if self.worker is None:
            self.worker = SimpleWorker([self.queue], connection=self.redis)
        got = self.worker.dequeue_job_and_maintain_ttl(max(1, math.ceil(timeout)))
        if got is None:
            return None
        job, queue = got
        _queue_jobs.LAST.clear()
        self.worker.execute_job(job, queue)  # runs _queue_jobs.record(payload)
        return _queue_jobs.LAST[0], None

    def done(self, handle: Any) -> None:
        return None

    def close(self) -> None:
        self.redis.close()


# -- jobs (run in the worker processes) --------------------------------------------------------
def _queue_webhook_job(adapter: Any, args: tuple[Any, ...], go: float) -> list[Handled]:
    """Role "put": the receiver, putting each webhook as it arrives, then a stop message per
    consumer once all are handled. Role "get": a worker."""
    role, arrivals, work, counter, consumers = args
    pid = os.getpid()
    clock = time.monotonic
    if role == "put":
        for index, (order, at) in enumerate(arrivals):
            delay = go + at - clock()
            if delay > 0:
                time.sleep(delay)
            adapter.put({"i": index, "o": order}, key=order)
        while counter.value < len(arrivals):
            time.sleep(0.005)
        for _ in range(consumers):
            adapter.put({"stop": True})
        return []
    handled: list[Handled] = []
    while True:
        got = adapter.take(timeout=30)
        if got is None:
            raise RuntimeError("no message for 30 s")
        payload, handle = got
        if "stop" in payload:
            adapter.done(handle)
            return handled
        took = start = clock()
        time.sleep(work)
        end = clock()
        adapter.done(handle)
        with counter.get_lock():
            counter.value += 1
        handled.append(Handled(payload["i"], payload["o"], pid, took, start, end))


def _throughput_job(adapter: Any, args: tuple[Any, ...], go: float) -> Any:
    """Role "put": put ``count`` messages at ``rate`` per second (0: pre-filled, nothing to
    do). Role "get": take and settle until a stop message; record (sent, start)."""
    role, count, rate, consumers = args
    clock = time.monotonic
    if role == "put":
        for i in range(count):
            if rate:
                delay = go + i / rate - clock()
                if delay > 0:
                    time.sleep(delay)
            adapter.put({"i": i, "t": clock()})
        for _ in range(consumers):
            adapter.put({"stop": True, "t": clock()})
        return []
    seen: list[tuple[float, float, float]] = []
    while True:
        got = adapter.take(timeout=30)
        if got is None:
            raise RuntimeError("no message for 30 s")
        payload, handle = got
        start = clock()
        adapter.done(handle)
        if "stop" in payload:
            return seen
        seen.append((payload["t"], start, clock()))


# -- scenarios ---------------------------------------------------------------------------------
@dataclass
class WebhookRow:
    store: str
    how: str
    makespan_s: float
    ideal_s: float
    efficiency: float
    order_violations: int
    overlaps: int
    worker_wait_s: float  # summed: holding a webhook it could not start yet
    start_p50_ms: float  # arrival -> start
    start_p99_ms: float


def _webhook_row(store: str, how: str, handled: list[Handled], go: float,
                 scenario: WebhookScenario, workers: int, work: float) -> WebhookRow:
    arrivals = scenario.arrivals
    done = [h for h in handled if not math.isnan(h.end)]
    metrics = webhook_metrics(done)
    ideal = ideal_makespan(scenario, workers, work)
    makespan = max(h.end for h in done) - go
    lat = [h.start - (go + arrivals[h.index].at) for h in done]
    return WebhookRow(
        store, how, makespan, ideal, ideal / makespan, metrics["order_violations"],
        metrics["overlaps"], sum(h.start - h.took for h in done),
        percentile(lat, 50) * 1000, percentile(lat, 99) * 1000,
    )


def run_webhook_pair(store: str, url: str, scenario: WebhookScenario, workers: int,
                     work: float) -> list[WebhookRow]:
    rows = []
    arrivals = [(a.order, a.at) for a in scenario.arrivals]
    print(f"  webhooks by lock   on {store}", file=sys.stderr, flush=True)
    lock = Contender("lock", _partial(TurnstileLock, url))
    counter = SPAWN.Value("q", 0)
    prefix = f"bench-{secrets.token_hex(4)}:order:"
    run = run_workers(lock, _webhook_job, [(prefix, arrivals, work, counter)] * workers,
                      timeout=600)
    handled = [h for r in run.results for h in r]
    rows.append(_webhook_row(store, "by lock", handled, min(run.go_times), scenario, workers,
                             work))
    print(f"  webhooks by queue  on {store}", file=sys.stderr, flush=True)
    name = f"bench-{secrets.token_hex(4)}:webhooks"
    queue = Contender("queue", _partial(TurnstileQueue, url, name))
    counter = SPAWN.Value("q", 0)
    jobs = [("put", arrivals, work, counter, workers)] + [
        ("get", arrivals, work, counter, workers)] * workers
    run = run_workers(queue, _queue_webhook_job, jobs, timeout=600)
    handled = [h for r in run.results for h in r]
    rows.append(_webhook_row(store, "by queue", handled, min(run.go_times), scenario, workers,
                             work))
    return rows


@dataclass
class ThroughputRow:
    store: str
    queue: str
    messages: int
    consumers: int
    per_second: float
    paced_rate: float
    latency_p50_ms: float
    latency_p99_ms: float
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _partial(cls: Any, *args: Any) -> Any:
    import functools

    return functools.partial(cls, *args)


def run_throughput(store: str, label: str, factory: Any, count: int, paced: int, rate: float,
                   consumers: int, note: str = "") -> ThroughputRow:
    print(f"  throughput {label} on {store}", file=sys.stderr, flush=True)
    contender = Contender(label, factory)
    # drain: count messages put before the start line (by the parent, through one adapter)
    filler = factory()
    for i in range(count):
        filler.put({"i": i, "t": 0.0})
    for _ in range(consumers):
        filler.put({"stop": True, "t": 0.0})
    filler.close()
    run = run_workers(contender, _throughput_job, [("get", 0, 0, consumers)] * consumers,
                      timeout=900)
    seen = [s for r in run.results for s in r]
    elapsed = max(e for _, _, e in seen) - min(run.go_times)
    per_second = len(seen) / elapsed
    # latency: paced puts while consumers wait
    jobs = [("put", paced, rate, consumers)] + [("get", 0, 0, consumers)] * consumers
    run = run_workers(contender, _throughput_job, jobs, timeout=900)
    lat = [start - sent for r in run.results for sent, start, _ in r]
    return ThroughputRow(store, label, count, consumers, per_second, rate,
                         percentile(lat, 50) * 1000, percentile(lat, 99) * 1000, note)


# -- stores ------------------------------------------------------------------------------------
@contextlib.contextmanager
def sqlite_store(tmpdir: Path | None = None) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-queue-", dir=tmpdir) as folder:
        yield f"sqlite:///{folder}/bench.db"


@contextlib.contextmanager
def redis_store(server: str) -> Iterator[str]:
    import redis

    prefix = f"bench-q-{secrets.token_hex(4)}:"
    sep = "&" if "?" in server else "?"
    try:
        yield f"{server}{sep}prefix={prefix}"
    finally:
        client = redis.Redis.from_url(server)
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        client.close()


@contextlib.contextmanager
def postgres_store(server: str) -> Iterator[tuple[str, str]]:
    import psycopg

    schema = f"bench_q_{secrets.token_hex(4)}"
    sep = "&" if "?" in server else "?"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.jobs (id bigint GENERATED ALWAYS AS IDENTITY"
                     " PRIMARY KEY, payload jsonb NOT NULL)")
    try:
        yield f"{server}{sep}schema={schema}", schema
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def rq_cleanup(server: str, name: str) -> None:
    import redis

    client = redis.Redis.from_url(server)
    for key in client.scan_iter(match=f"rq:*{name}*", count=1000):
        client.delete(key)
    client.close()


# -- main --------------------------------------------------------------------------------------
def _command(argv: list[str]) -> str:
    """The exact command, with the server URLs it read from the environment (passwords
    redacted), so that the results file says how to run it again."""
    from turnstile._core.urls import redact

    env = [f"{var}={redact(os.environ[var])}" for var in
           ("TURNSTILE_TEST_REDIS_URL", "TURNSTILE_TEST_POSTGRES_URL") if os.environ.get(var)]
    return " ".join([*env, "python benchmarks/bench_queue.py", *argv])


def reading(webhooks: list[WebhookRow], throughput: list[ThroughputRow],
            info: dict[str, Any]) -> list[str]:
    """'Reading the results', from this run's numbers."""
    rate = {(r.store, r.queue): r.per_second for r in throughput}
    load = info.get("loadavg")
    out = ["## Reading the results", ""]
    out.append(f"- Compare rows of this run only: the machine is shared (load average at start "
               f"{load[0]:.1f} on {info.get('nproc', '?')} cores), and absolute figures move "
               "between runs." if load else "- Compare rows of this run only.")
    by_queue = [r for r in webhooks if r.how == "by queue"]
    by_lock = [r for r in webhooks if r.how == "by lock"]
    if by_queue:
        waits = ", ".join(f"{r.store} {r.worker_wait_s:.2f} s" for r in by_lock)
        out.append(
            "- **Webhooks.** By queue, no worker ever holds a webhook it cannot start (*worker "
            "wait* 0) and order is kept by construction ("
            f"{sum(r.order_violations for r in by_queue)} violations over "
            f"{len(by_queue)} stores). By lock, workers spent in all {waits} waiting in line "
            "while holding a webhook; two workers that take consecutive webhooks of one order "
            "race to the lock, so order violations can appear there (with the queue they "
            "cannot).")
    sq = rate.get(("sqlite", "turnstile"))
    rd = rate.get(("redis", "turnstile"))
    if sq and rd:
        out.append(
            f"- **SQLite queue**: {sq:,.0f} messages/s, {sq / rd:.2f}x the Turnstile queue on "
            "Redis in this run, on one host with no server. A claim walks the ready messages in "
            "arrival order and takes the first that heads its key (one index seek when the "
            "oldest is deliverable).")
    pg = rate.get(("postgres", "turnstile"))
    skip = rate.get(("postgres", "SKIP LOCKED table"))
    if pg and skip:
        out.append(
            f"- **PostgreSQL queue**: {pg:,.0f} messages/s, {pg / skip:.2f}x the plain `SKIP "
            "LOCKED` table. Every operation of one queue is serialised on the queue's row: "
            "that keeps the global cap exact, the per-key order strict and wake-ups from being "
            "missed (docs/queue.md), at three transactions per message (put, claim, ack). The "
            "`SKIP LOCKED` table keeps none of those guarantees (no keys, no cap, and a "
            "consumer's crash loses its message unless it holds a transaction open).")
    rq = rate.get(("redis", "RQ (SimpleWorker)"))
    if rq and rd:
        out.append(
            f"- **RQ** runs each message as a job with RQ's bookkeeping (job hash, registries, "
            f"status updates): {rq:,.0f} messages/s with its `SimpleWorker`s, against "
            f"{rd:,.0f} for the Turnstile queue on the same Redis ({rd / rq:.1f}x; one Lua "
            "script per put, claim and ack).")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, write no file")
    parser.add_argument("--json", action="store_true", help="JSON on stdout")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--tmpdir", type=Path, default=None, help="where the SQLite file goes")
    parser.add_argument("--redis", default=os.environ.get("TURNSTILE_TEST_REDIS_URL"))
    parser.add_argument("--postgres", default=os.environ.get("TURNSTILE_TEST_POSTGRES_URL"))
    parser.add_argument("--orders", type=int, default=None)
    parser.add_argument("--per-order", type=int, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--work", type=float, default=None, help="seconds per webhook")
    parser.add_argument("--spacing", type=float, default=None, help="seconds between arrivals")
    parser.add_argument("--messages", type=int, default=None, help="throughput: drained")
    parser.add_argument("--paced", type=int, default=None, help="latency: messages put")
    parser.add_argument("--rate", type=float, default=None, help="latency: puts per second")
    parser.add_argument("--consumers", type=int, default=None)
    args = parser.parse_args(argv)
    q = args.quick
    orders = args.orders or (4 if q else 20)
    per_order = args.per_order or (3 if q else 10)
    workers = args.workers or (3 if q else 8)
    work = args.work if args.work is not None else (0.01 if q else 0.02)
    spacing = args.spacing if args.spacing is not None else (0.002 if q else 0.005)
    messages = args.messages or (100 if q else 2000)
    paced = args.paced or (50 if q else 500)
    rate = args.rate or (100.0 if q else 200.0)
    consumers = args.consumers or (2 if q else 4)
    scenario = WebhookScenario.random(orders, per_order, seed=1, spacing=spacing)
    command = _command(argv)
    info = machine_info(["redis", "psycopg", "rq"])  # before the runs: the load at start

    webhooks: list[WebhookRow] = []
    throughput: list[ThroughputRow] = []
    with sqlite_store(args.tmpdir) as url:
        webhooks += run_webhook_pair("sqlite", url, scenario, workers, work)
        throughput.append(run_throughput(
            "sqlite", "turnstile", _partial(TurnstileQueue, url, "tp"), messages, paced, rate,
            consumers))
    if args.redis:
        with redis_store(args.redis) as url:
            webhooks += run_webhook_pair("redis", url, scenario, workers, work)
            throughput.append(run_throughput(
                "redis", "turnstile", _partial(TurnstileQueue, url, "tp"), messages, paced,
                rate, consumers))
        name = f"bench-{secrets.token_hex(4)}"
        try:
            throughput.append(run_throughput(
                "redis", "RQ (SimpleWorker)", _partial(RQQueue, args.redis, name), messages,
                paced, rate, consumers, "no keys, no cap; a job per message"))
        finally:
            rq_cleanup(args.redis, name)
    if args.postgres:
        with postgres_store(args.postgres) as (url, schema):
            webhooks += run_webhook_pair("postgres", url, scenario, workers, work)
            throughput.append(run_throughput(
                "postgres", "turnstile", _partial(TurnstileQueue, url, "tp"), messages, paced,
                rate, consumers))
            throughput.append(run_throughput(
                "postgres", "SKIP LOCKED table", _partial(SkipLockedQueue, args.postgres, schema),
                messages, paced, rate, consumers,
                "no keys, no cap, no visibility timeout; LISTEN/NOTIFY"))

    lines = ["# Queue benchmark", "", *machine_lines(info, command), "",
             f"## Webhooks: by queue vs by lock ({scenario.name}, {workers} workers, "
             f"{work * 1000:g} ms of work each, arriving {spacing * 1000:g} ms apart)", "",
             markdown_table(
                 ["store", "how", "makespan s", "ideal s", "efficiency", "order violations",
                  "overlaps", "worker wait s", "arrival->start p50 ms", "p99 ms"],
                 [[r.store, r.how, r.makespan_s, r.ideal_s, r.efficiency, r.order_violations,
                   r.overlaps, r.worker_wait_s, r.start_p50_ms, r.start_p99_ms]
                  for r in webhooks]),
             "", "*worker wait*: seconds (summed over webhooks) a worker held a webhook it could"
             " not start yet because its order was busy; by queue a worker is only handed a"
             " webhook whose order has nothing in flight.", "",
             f"## Throughput ({consumers} consumers; drain of {messages} queued messages; "
             f"latency of {paced} messages put at {rate:g}/s)", "",
             markdown_table(
                 ["store", "queue", "messages/s", "put->start p50 ms", "p99 ms", "notes"],
                 [[r.store, r.queue, r.per_second, r.latency_p50_ms, r.latency_p99_ms, r.notes]
                  for r in throughput]),
             "", *reading(webhooks, throughput, info)]
    text = "\n".join(lines)
    if args.json:
        print(to_json({"machine": info, "command": command, "webhooks": webhooks,
                       "throughput": throughput}))
    else:
        print(text)
    output = args.output or (None if q or args.json else RESULTS)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
    bad = [r for r in webhooks if r.how == "by queue" and (r.order_violations or r.overlaps)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
