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
lock* (the lock benchmarks' scenario): W workers take the next webhook from a shared feed as it
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
import functools
import importlib.util
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turnstile_bench import Bench, WebhookScenario, machine_lines, main, markdown_table
from turnstile_bench.adapters import (
    DramatiqQueue,
    ProcrastinateQueue,
    RQQueue,
    SkipLockedQueue,
    TurnstileQueue,
    TurnstileWorkQueue,
)
from turnstile_bench.scenarios import ThroughputRow, WebhookRow, run_throughput, run_webhook_pair
from turnstile_bench.servers import (
    delete_redis_keys,
    postgres_schema,
    procrastinate_database,
    redis_prefix,
    scratch_folder,
)


def forget_rq_queue(url: str, name: str) -> None:
    """RQ lists every queue it saw in the set ``rq:queues``: take ours out (and the set, if
    nothing else is left in it)."""
    import contextlib

    import redis

    with contextlib.closing(redis.Redis.from_url(url)) as r:
        r.srem("rq:queues", f"rq:queue:{name}")
        if not r.scard("rq:queues"):
            r.delete("rq:queues")


# The rows of Turnstile's own worker loop (q.work) on PostgreSQL, where it acks a message and
# claims the next in one transaction.
WORK = "turnstile (q.work)"
# The batch rows: q.work(prefetch=10) beside a SKIP LOCKED table taking 10 at once. Keyless
# only: the drain ends with one keyless stop message per consumer, which a keyed drain's
# batches can claim (beside the heads of their keys) while later messages of those keys
# still wait, so the consumers would stop before the queue is drained.
PREFETCH = 10
WORK_BATCH = f"turnstile (q.work, prefetch {PREFETCH})"
SKIP_BATCH = f"SKIP LOCKED table, {PREFETCH} per statement"


def has(module: str) -> bool:
    """A peer from the ``bench`` extra is installed (its rows are left out otherwise)."""
    return importlib.util.find_spec(module) is not None


@dataclass(frozen=True)
class QueueSizes:
    orders: int
    per_order: int
    workers: int
    work: float
    spacing: float
    messages: int
    paced: int
    rate: float
    consumers: int
    keys: int

    @classmethod
    def of(cls, args: argparse.Namespace) -> QueueSizes:
        q = args.quick
        return cls(
            orders=args.orders or (4 if q else 20),
            per_order=args.per_order or (3 if q else 10),
            workers=args.workers or (3 if q else 8),
            work=args.work if args.work is not None else (0.01 if q else 0.02),
            spacing=args.spacing if args.spacing is not None else (0.002 if q else 0.005),
            messages=args.messages or (100 if q else 10000),
            paced=args.paced or (50 if q else 500),
            rate=args.rate or (100.0 if q else 200.0),
            consumers=args.consumers or (2 if q else 4),
            keys=args.keys or (8 if q else 64),
        )

    def scenario(self) -> WebhookScenario:
        return WebhookScenario.random(
            self.orders, self.per_order, seed=1, spacing=self.spacing, work=self.work
        )


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
    rate = {(r.store, r.queue): r.per_second for r in throughput if not r.keys}
    keyed = {(r.store, r.queue): r for r in throughput if r.keys}
    lat = {(r.store, r.queue): r for r in throughput if not r.keys}
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
    pw = rate.get(("postgres", WORK))
    if pg and skip:
        line = (f"- **PostgreSQL queue**: {pg:,.0f} messages/s with `get` + `ack`, "
                f"{pg / skip:.2f}x the plain `SKIP LOCKED` table")
        if pw:
            line += (f"; {pw:,.0f} with its worker loop `q.work` ({pw / skip:.2f}x), which acks "
                     "a message and claims the next in one transaction (consumed as its "
                     "handler, as a user's handler runs: benchmarks/README.md)")
        kw, kg = keyed.get(("postgres", WORK)), keyed.get(("postgres", "turnstile"))
        if kw and kg:
            line += (f"; keyed ({kw.keys} keys) {kg.per_second:,.0f} ({kg.per_second / skip:.2f}x) "
                     f"and {kw.per_second:,.0f} ({kw.per_second / skip:.2f}x)")
        out.append(
            line + ". The operations of one queue run side by side (claims `FOR UPDATE SKIP "
            "LOCKED`; puts, the cap's count and waiter registration under narrow locks), "
            "keeping the global cap exact, the per-key order strict and wake-ups from being "
            "missed (docs/queue.md); each `get` and each `ack` is a durable commit. The "
            "`SKIP LOCKED` table keeps none of those guarantees (no keys, no cap, and a "
            "consumer's crash loses its message unless it holds a transaction open) and "
            "commits once per message.")
    pb, sb = rate.get(("postgres", WORK_BATCH)), rate.get(("postgres", SKIP_BATCH))
    if pb and skip:
        line = (f"- **Batches on PostgreSQL** (`q.work(prefetch={PREFETCH})`: one transaction "
                f"acks a batch and claims the next): {pb:,.0f} messages/s, {pb / skip:.2f}x the "
                "`SKIP LOCKED` table taking one message per statement")
        if sb:
            line += (f". Against the same table taking {PREFETCH} per statement ({sb:,.0f}/s), "
                     f"{pb / sb:.2f}x: that table deletes its batch in one statement and keeps "
                     "nothing (a consumer's crash loses the whole batch), where the Turnstile "
                     "step acks each message by id, claims the batch in one statement and keeps "
                     "every message until its ack (visibility timeout, keys, cap)")
        out.append(line + ". A batch's acks wait until it has run: prefetch trades latency "
                   "per key for throughput (docs/queue.md, \"Prefetch\").")
    for store, plain, step in (("redis", rd, "script"), ("sqlite", sq, "transaction")):
        sw, sb2 = rate.get((store, WORK)), rate.get((store, WORK_BATCH))
        if sw and plain:
            line = (f"- **Worker loop on {'Redis' if store == 'redis' else 'SQLite'}**: "
                    f"`q.work` {sw:,.0f} messages/s ({sw / plain:.2f}x `get` + `ack`: one {step} "
                    "acks a message and claims the next)")
            if sb2:
                line += (f"; with `prefetch={PREFETCH}` {sb2:,.0f} ({sb2 / plain:.2f}x: one "
                         f"{step} per batch)")
            out.append(line + ".")
    rq = rate.get(("redis", "RQ (SimpleWorker)"))
    if rq and rd:
        out.append(
            f"- **RQ** runs each message as a job with RQ's bookkeeping (job hash, registries, "
            f"status updates): {rq:,.0f} messages/s with its `SimpleWorker`s, against "
            f"{rd:,.0f} for the Turnstile queue on the same Redis ({rd / rq:.1f}x; one Lua "
            "script per put, claim and ack).")
    dq = rate.get(("redis", "Dramatiq (RedisBroker)"))
    if dq and rd:
        rw = rate.get(("redis", WORK))
        loop = f", {rw / dq:.2f}x with its worker loop `q.work`" if rw else ""
        out.append(
            f"- **Dramatiq** (its `RedisBroker` consumer, prefetch 1): {dq:,.0f} messages/s, "
            f"the Turnstile queue {rd / dq:.2f}x that on the same Redis with `get` + `ack`"
            f"{loop}; put->start p50 "
            f"{lat[('redis', 'Dramatiq (RedisBroker)')].latency_p50_ms:.1f} ms against "
            f"{lat[('redis', 'turnstile')].latency_p50_ms:.2f} ms: an idle Dramatiq consumer "
            "polls with an exponential back-off, a Turnstile consumer is woken by the put.")
    pr = rate.get(("postgres", "procrastinate"))
    if pr and pg:
        line = (f"- **procrastinate** (its own `Worker`, LISTEN/NOTIFY, consumed as its "
                f"task, as `q.work` is as its handler): {pr:,.0f} messages/s without a lock, "
                f"against {pg:,.0f} for the Turnstile queue on the same PostgreSQL with `get` "
                f"+ `ack` ({pg / pr:.2f}x)")
        if pw:
            line += f" and {pw:,.0f} with its worker loop ({pw / pr:.2f}x)"
        kp, kt = keyed.get(("postgres", "procrastinate")), keyed.get(("postgres", "turnstile"))
        kw = keyed.get(("postgres", WORK))
        if kp and kt:
            line += (f"; with a `lock` per key ({kp.keys} keys), {kp.per_second:,.0f} against "
                     f"Turnstile's keyed queue {kt.per_second:,.0f} "
                     f"({kt.per_second / kp.per_second:.2f}x)")
            if kw:
                line += (f" and {kw.per_second:,.0f} with its worker loop "
                         f"({kw.per_second / kp.per_second:.2f}x)")
            line += (f"; put->start p50 {kp.latency_p50_ms:.1f} ms against "
                     f"{kt.latency_p50_ms:.1f} ms")
        out.append(line + ". procrastinate's lock only orders jobs that are already queued "
                   "(a job whose lock is held waits, in id order); it has no cap and no "
                   "visibility timeout (a worker that dies leaves its job `doing` until "
                   "`retry_stalled_jobs` is run).")
    behind = [r for r in throughput if r.per_second < r.paced_rate]
    if behind:
        out.append(
            "- **Backlog**: " + ", ".join(f"{r.store} {r.queue}" + (" (keyed)" if r.keys else "")
                                          for r in behind)
            + f" drained fewer messages per second than the latency test puts "
            f"({behind[0].paced_rate:g}/s), so their put->start latency there is mostly the "
            "backlog growing, not the queue's wake-up.")
    kr = keyed.get(("redis", "turnstile"))
    if kr and rd:
        out.append(f"- **Keys** ({kr.keys} keys, one message in flight per key): the Turnstile "
                   f"queue on Redis drains {kr.per_second:,.0f} messages/s "
                   f"({kr.per_second / rd:.2f}x keyless).")
    return out


class QueueBench(Bench):
    name = "queue"
    description = __doc__ or ""
    packages = ("redis", "psycopg", "rq", "dramatiq", "procrastinate")
    tmpdir_help = "where the SQLite file goes"
    json_writes_results = False

    def options(self, parser: argparse.ArgumentParser) -> None:
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
        parser.add_argument("--keys", type=int, default=None,
                            help="keyed throughput rows: messages spread over this many keys")

    def run(self, args: argparse.Namespace, target: None) -> dict[str, Any]:
        s = QueueSizes.of(args)
        scenario = s.scenario()
        tp = functools.partial(run_throughput, count=s.messages, paced=s.paced, rate=s.rate,
                               consumers=s.consumers)
        webhooks: list[WebhookRow] = []
        throughput: list[ThroughputRow] = []
        with scratch_folder(args.tmpdir, prefix="turnstile-bench-queue-") as folder:
            url = f"sqlite:///{folder}/bench.db"
            webhooks += run_webhook_pair("sqlite", url, scenario, s.workers)
            throughput.append(
                tp("sqlite", "turnstile", functools.partial(TurnstileQueue, url, "tp"))
            )
            throughput.append(tp(
                "sqlite", WORK, functools.partial(TurnstileWorkQueue, url, "tpw"),
                note="its worker loop: ack + next claim in one transaction"))
            throughput.append(tp(
                "sqlite", WORK_BATCH,
                functools.partial(TurnstileWorkQueue, url, "tpwb", prefetch=PREFETCH),
                note=f"claims {PREFETCH} and acks them in one transaction per batch"))
        keyed = functools.partial(tp, keys=s.keys)
        if args.redis:
            with redis_prefix(args.redis) as url:
                webhooks += run_webhook_pair("redis", url, scenario, s.workers)
                throughput.append(
                    tp("redis", "turnstile", functools.partial(TurnstileQueue, url, "tp"))
                )
                throughput.append(keyed(
                    "redis", "turnstile", functools.partial(TurnstileQueue, url, "tpk"),
                    note="per-key FIFO, one in flight per key"))
                throughput.append(tp(
                    "redis", WORK, functools.partial(TurnstileWorkQueue, url, "tpw"),
                    note="its worker loop: ack + next claim in one script"))
                throughput.append(tp(
                    "redis", WORK_BATCH,
                    functools.partial(TurnstileWorkQueue, url, "tpwb", prefetch=PREFETCH),
                    note=f"claims {PREFETCH} and acks them in one script per batch"))
            name = f"bench-{secrets.token_hex(4)}"
            try:
                throughput.append(tp(
                    "redis", "RQ (SimpleWorker)", functools.partial(RQQueue, args.redis, name),
                    note="no keys, no cap; a job per message"))
            finally:
                delete_redis_keys(args.redis, f"rq:*{name}*")
                forget_rq_queue(args.redis, name)
            if has("dramatiq"):
                namespace = f"bench-dq-{secrets.token_hex(4)}"
                try:
                    throughput.append(tp(
                        "redis", "Dramatiq (RedisBroker)",
                        functools.partial(DramatiqQueue, args.redis, namespace),
                        note="no keys, no cap; consumer polls with back-off when empty"))
                finally:
                    delete_redis_keys(args.redis, f"{namespace}*")
        if args.postgres:
            with postgres_schema(args.postgres) as (url, schema):
                webhooks += run_webhook_pair("postgres", url, scenario, s.workers)
                throughput.append(
                    tp("postgres", "turnstile", functools.partial(TurnstileQueue, url, "tp"))
                )
                throughput.append(keyed(
                    "postgres", "turnstile", functools.partial(TurnstileQueue, url, "tpk"),
                    note="per-key FIFO, one in flight per key"))
                throughput.append(tp(
                    "postgres", WORK, functools.partial(TurnstileWorkQueue, url, "tpw"),
                    note="its worker loop: ack + next claim in one transaction"))
                throughput.append(keyed(
                    "postgres", WORK, functools.partial(TurnstileWorkQueue, url, "tpwk"),
                    note="its worker loop; per-key FIFO, one in flight per key"))
                throughput.append(tp(
                    "postgres", "SKIP LOCKED table",
                    functools.partial(SkipLockedQueue, args.postgres, schema),
                    note="no keys, no cap, no visibility timeout; LISTEN/NOTIFY"))
                throughput.append(tp(
                    "postgres", WORK_BATCH,
                    functools.partial(TurnstileWorkQueue, url, "tpwb", prefetch=PREFETCH),
                    note=f"claims {PREFETCH} and acks them in one transaction per batch"))
                throughput.append(tp(
                    "postgres", SKIP_BATCH,
                    functools.partial(SkipLockedQueue, args.postgres, schema, batch=PREFETCH),
                    note=f"deletes up to {PREFETCH} per statement; a crash loses them all"))
            if has("procrastinate"):
                with procrastinate_database(args.postgres) as proc_url:
                    throughput.append(tp(
                        "postgres", "procrastinate",
                        functools.partial(ProcrastinateQueue, proc_url),
                        note="no lock; its Worker, LISTEN/NOTIFY, jobs deleted when done"))
                    throughput.append(keyed(
                        "postgres", "procrastinate",
                        functools.partial(ProcrastinateQueue, proc_url),
                        note="lock=key: one job per lock at a time (its per-key serialisation)"))
        return {"command": _command(args.argv), "webhooks": webhooks, "throughput": throughput}

    def markdown(
        self, results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]
    ) -> str:
        s = QueueSizes.of(args)
        webhooks, throughput = results["webhooks"], results["throughput"]
        lines = ["# Queue benchmark", "", *machine_lines(info, results["command"]), "",
                 f"## Webhooks: by queue vs by lock ({s.scenario().name}, {s.workers} workers, "
                 f"{s.work * 1000:g} ms of work each, arriving {s.spacing * 1000:g} ms apart)",
                 "",
                 markdown_table(
                     ["store", "how", "makespan s", "ideal s", "efficiency", "order violations",
                      "overlaps", "worker wait s", "arrival->start p50 ms", "p99 ms"],
                     [[r.store, r.how, r.makespan_s, r.ideal_s, r.efficiency, r.order_violations,
                       r.overlaps, r.worker_wait_s, r.start_p50_ms, r.start_p99_ms]
                      for r in webhooks]),
                 "", "*worker wait*: seconds (summed over webhooks) a worker held a webhook it"
                 " could not start yet because its order was busy; by queue a worker is only"
                 " handed a webhook whose order has nothing in flight.", "",
                 f"## Throughput ({s.consumers} consumers; drain of {s.messages} queued messages;"
                 f" latency of {s.paced} messages put at {s.rate:g}/s)", "",
                 markdown_table(
                     ["store", "queue", "keys", "messages/s", "put->start p50 ms", "p99 ms",
                      "notes"],
                     [[r.store, r.queue, r.keys or "-", r.per_second, r.latency_p50_ms,
                       r.latency_p99_ms, r.notes] for r in throughput]),
                 "", *reading(webhooks, throughput, info)]
        return "\n".join(lines)

    def footer(self, info: dict[str, Any]) -> str:
        return "\n"

    def sane(self, results: dict[str, Any]) -> bool:
        """By queue, order is kept by construction: a violation or overlap is a bug."""
        return not [
            r for r in results["webhooks"]
            if r.how == "by queue" and (r.order_violations or r.overlaps)
        ]


if __name__ == "__main__":
    sys.exit(main(QueueBench()))
