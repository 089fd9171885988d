#!/usr/bin/env python3
"""Rate limits under contention: Turnstile's rate limit (callers wait in line, each woken at
its slot) beside ``limits``' moving window (callers hit, and when refused sleep until the
window's reset and hit again — the way it is used).

    python benchmarks/bench_admission.py            # full run, writes results/admission.md
    python benchmarks/bench_admission.py --quick    # tiny sizes, writes no file (CI)

Rows, all in one run, each with 8 and 64 callers calling in a closed loop for ``--seconds``:

* **Turnstile** ``client.rate_limit(name, rate, per, burst)``, callers ``acquire()`` in a
  loop: SQLite (a file in the scratch folder), memory (one process, callers are threads),
  and Redis / PostgreSQL when the store implements rate limits (on a branch without them the
  row says "not available" and why);
* **limits** ``MovingWindowRateLimiter`` with ``rate + burst`` per ``per`` (the same window
  bound as Turnstile's) on Redis and on its memory storage (one process, threads);
* **DBOS** (when ``dbos`` is installed and PostgreSQL given): a queue registered with
  ``limiter={"limit": rate + burst, "period": per}`` (the same window bound), every caller
  process running DBOS (``DBOS.launch()``); a caller enqueues a workflow, waits for its
  result, and enqueues the next. Admitted = DBOS started the workflow. One row per
  ``--dbos-polling`` interval (how often each process polls the queue; DBOS's default 1 s).

Callers: 8 = 8 processes of one caller each; 64 = 4 processes x 16 threads (memory rows:
one process, 8 or 64 threads). Redis: ``--redis URL``, else a ``redis-server`` of the run's
own (so ``INFO commandstats`` counts only this run), else ``$TURNSTILE_TEST_REDIS_URL``;
keys under a fresh prefix, deleted afterwards. PostgreSQL: ``--postgres URL`` or
``$TURNSTILE_TEST_POSTGRES_URL`` (a schema of the run's own for Turnstile, and a database of
the run's own, ``tt_bench_dbos_<random>``, for DBOS; both dropped afterwards).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turnstile_bench import (
    Bench,
    Contender,
    Grant,
    LockAdapter,
    certain_fifo_violations,
    command_line,
    fifo_violations,
    machine_lines,
    main,
    markdown_table,
    percentile,
    run_workers,
)
from turnstile_bench.adapters import CommandCounter
from turnstile_bench.plots import Figure
from turnstile_bench.servers import (
    Unavailable,
    dbos_database,
    delete_redis_keys,
    own_redis,
    postgres_schema,
    redis_prefix,
    scratch_folder,
)
from turnstile_bench.workers import progress

THREADS_64 = (4, 16)  # 64 callers: processes x threads each (more than 8: n / 4 threads)
WARM = {"rate": 100_000, "per": 1.0, "burst": 10_000}  # the private warm-up limit


# -- callers ----------------------------------------------------------------------------------
class _Recording:
    """A backend proxy that counts store steps and keeps the last answer of ``rate_acquire``
    (the announced slot), per thread."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.steps = 0
        self.results: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def rate_acquire(self, *args: Any, **kwargs: Any) -> Any:
        self.steps += 1
        result = self._backend.rate_acquire(*args, **kwargs)
        self.results.append(result)
        return result

    def rate_leave(self, *args: Any, **kwargs: Any) -> Any:
        self.steps += 1
        return self._backend.rate_leave(*args, **kwargs)


class TurnstileCaller:
    def __init__(self, client: Any, spec: dict[str, Any], holder: str) -> None:
        from turnstile import RateLimit

        self.recording = _Recording(client.backend)
        self.spec, self.holder = spec, holder
        self._limit = functools.partial(RateLimit, self.recording)

    def admit(self, name: str) -> dict[str, float]:
        """One blocking ``acquire()``: when it was called (wall clock), when the caller was
        confirmed in line and the slot the store last announced (store clock; NaN if admitted
        at the first ask), the admission (store clock), the store steps."""
        rec = self.recording
        rec.steps, rec.results = 0, []
        called = time.time()
        admitted = self._limit(name, **self.spec).acquire(timeout=120, holder=self.holder)
        waits = [r for r in rec.results if not r.admitted]
        return {
            "called": called,
            "queued": waits[0].now if waits else math.nan,
            "slot": waits[-1].now + waits[-1].retry_after if waits else math.nan,
            "admitted": admitted,
            "steps": rec.steps,
        }


class LimitsCaller:
    def __init__(self, limiter: Any, item: Any, key: str) -> None:
        self.limiter, self.item, self.key = limiter, item, key

    def admit(self, name: str) -> dict[str, float]:
        """``hit()``; when refused, ``get_window_stats`` and sleep until its reset, then hit
        again. The admission time is read just before the successful hit (limits stamps the
        hit with the same clock inside the call); the slot is the last reset it was told."""
        called = time.time()
        steps, announced = 0, math.nan
        while True:
            now = time.time()
            steps += 1
            if self.limiter.hit(self.item, self.key, name):
                return {"called": called, "queued": math.nan, "slot": announced,
                        "admitted": now, "steps": steps}
            steps += 1
            announced = self.limiter.get_window_stats(self.item, self.key, name).reset_time
            time.sleep(max(0.0, announced - time.time()))


class DbosCaller:
    def __init__(self, queue: Any, workflow: Any, result_poll: float) -> None:
        self.queue, self.workflow, self.result_poll = queue, workflow, result_poll

    def admit(self, name: str) -> dict[str, Any]:
        """Enqueue the workflow and wait for its result (DBOS polls for it every
        ``result_poll`` s). ``queued``: when ``enqueue`` returned (the workflow is in the
        queue's table, committed); ``admitted``: when the workflow started (its own wall
        clock); DBOS's own stamps are read from its table after the run, by ``id``."""
        called = time.time()
        handle = self.queue.enqueue(self.workflow)
        queued = time.time()
        admitted = handle.get_result(polling_interval_sec=self.result_poll)
        return {"called": called, "queued": queued, "slot": math.nan, "admitted": admitted,
                "returned": time.time(), "steps": 0, "id": handle.get_workflow_id()}


class Callers(LockAdapter):
    """The callers of one worker process (``threads`` of them), built before the start line;
    ``acquire`` is the warm-up (each caller admitted once on a private name).

    ``dbos``: (queue polling interval, result polling interval) of a DBOS row, whose
    ``prefix`` is the queue's name."""

    def __init__(self, kind: str, url: str, spec: dict[str, Any], threads: int,
                 prefix: str = "", dbos: tuple[float, float] | None = None) -> None:
        pid = os.getpid()
        self.callers: list[Any] = []
        self.closers: list[Any] = []
        self.spec = spec
        self.kind, self.prefix = kind, prefix
        self.store_counter: Any = None
        if kind == "dbos":
            from turnstile_bench import dbos_jobs

            polling, result_poll = dbos or (1.0, 1.0)
            # DBOS's pool (default 20 a process) kept small: 4 x 16 threads stay under
            # max_connections; each process needs a connection per caller waiting for a
            # result (at most half the pool poll at once) and per workflow it runs.
            dbos_jobs.launch(url, pool_size=min(10, threads + 6))
            self.closers.append(dbos_jobs.shutdown)
            queue = dbos_jobs.register_queue(prefix, spec["rate"] + spec["burst"],
                                             spec["per"], polling)
            self.callers = [DbosCaller(queue, dbos_jobs.admit, result_poll)
                            for _ in range(threads)]
            self.store_counter = dbos_jobs.counts
        elif kind == "turnstile":
            import turnstile

            shared = turnstile.connect(url) if url.startswith("memory") else None
            for i in range(threads):
                client = shared or turnstile.connect(url)
                if client is not shared:
                    self.closers.append(client.close)
                self.callers.append(TurnstileCaller(client, spec, f"c{pid}-{i}"))
            if shared is not None:
                self.closers.append(shared.close)
        else:
            import limits
            from limits.storage import MemoryStorage, RedisStorage
            from limits.strategies import MovingWindowRateLimiter

            storage = (MemoryStorage() if url.startswith("memory")
                       else RedisStorage(url, key_prefix=prefix))
            limiter = MovingWindowRateLimiter(storage)
            item = limits.RateLimitItemPerSecond(spec["rate"] + spec["burst"], int(spec["per"]))
            self.warm_item = limits.RateLimitItemPerSecond(WARM["burst"], 1)
            self.callers = [LimitsCaller(limiter, item, prefix) for _ in range(threads)]
            if not url.startswith("memory"):
                self.closers.append(lambda: storage.storage.close())

    def acquire(self, name: str) -> None:
        if self.kind == "dbos":
            from turnstile_bench import dbos_jobs

            dbos_jobs.warm_up(self.prefix)
            return
        for c in self.callers:
            if isinstance(c, TurnstileCaller):
                c._limit(name, **WARM).acquire(timeout=60, holder=c.holder)
            else:
                c.limiter.hit(self.warm_item, c.key, name)

    def release(self) -> None:
        pass

    def close(self) -> None:
        for close in self.closers:
            with contextlib.suppress(Exception):
                close()


def _callers_job(adapter: Callers, args: tuple[str, float], go: float) -> dict[str, Any]:
    """Every caller of this process admits itself in a loop until ``go + seconds``; returns
    each admission's record and the start on the wall clock."""
    name, seconds = args
    start_wall = time.time()
    stop = go + seconds
    counter = getattr(adapter, "store_counter", None)
    before = counter() if counter else {}
    records: list[list[dict[str, Any]]] = [[] for _ in adapter.callers]
    errors: list[str] = []

    def loop(i: int) -> None:
        try:
            while time.monotonic() < stop:
                records[i].append(adapter.callers[i].admit(name))
        except Exception as exc:  # reported to the parent below
            errors.append(repr(exc))

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(adapter.callers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    after = counter() if counter else {}
    return {"start": start_wall, "pid": os.getpid(), "records": records,
            "store": {k: after[k] - before.get(k, 0) for k in after}}


# -- metrics ----------------------------------------------------------------------------------
def max_in_window(times: list[float], window: float) -> int:
    """The most admissions in any closed window ``[t - window, t]``."""
    ordered = sorted(times)
    best = start = 0
    for end, t in enumerate(ordered):
        while ordered[start] < t - window:
            start += 1
        best = max(best, end - start + 1)
    return best


def allowed_from_idle(library: str, spec: dict[str, Any], span: float) -> float:
    """The most admissions the contender's rule allows in ``[t0, t0 + span)`` from idle, ``t0``
    the first admission: GCRA admits ``burst`` at ``t0`` and then one every ``per / rate``
    (``burst - 1 + span * rate / per``); the moving window ``rate + burst`` at the start of
    each window (``(rate + burst) * ceil(span / per)``)."""
    rate, per, burst = spec["rate"], spec["per"], spec["burst"]
    if library == "turnstile":
        return burst - 1 + math.ceil(span * rate / per - 1e-9)
    return (rate + burst) * math.ceil(span / per - 1e-9)  # limits, DBOS: a rolling window


def row_metrics(records: list[dict[str, float]], library: str, seconds: float,
                spec: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one row (see the results file's legend)."""
    per, bound = spec["per"], spec["rate"] + spec["burst"]
    times = sorted(r["admitted"] for r in records)
    # Whole windows from the first admission, within the run.
    span = max(1, math.floor(seconds / per)) * per
    t0 = times[0] if times else 0.0
    counted = sum(1 for t in times if t0 <= t < t0 + span)
    allowed = allowed_from_idle(library, spec, span)
    waited = [r for r in records if not math.isnan(r["slot"])]
    late = [(r["admitted"] - r["slot"]) * 1000 for r in waited]
    grants = [Grant(int(r["caller"]), r["called"], r["admitted"], r["admitted"], r["queued"])
              for r in records]
    worst = max_in_window(times, per)
    return {
        "admissions": len(times),
        "span_s": span,
        "counted": counted,
        "allowed": allowed,
        "per_second": counted / span,
        "utilisation": counted / allowed if allowed else math.nan,
        "max_in_tenth": max_in_window(times, per / 10),
        "max_in_window": worst,
        "window_bound": bound,
        "excess": max(0, worst - bound),
        "waited": len(waited),
        "late_p50_ms": percentile(late, 50),
        "late_p99_ms": percentile(late, 99),
        "late_max_ms": max(late) if late else math.nan,
        "fifo_violations": fifo_violations(grants),
        "certain_fifo_violations": certain_fifo_violations(grants),
        "steps_per_admission": sum(r["steps"] for r in records) / len(records)
        if records else math.nan,
    }


def dbos_metrics(records: list[dict[str, Any]], stamps: dict[str, tuple[int, int]],
                 seconds: float, spec: dict[str, Any], store: dict[str, int]) -> dict[str, Any]:
    """The numbers of a DBOS row, the same columns as :func:`row_metrics` where they apply.

    ``stamps``: workflow id -> (``created_at``, ``started_at_epoch_ms``) from DBOS's
    ``workflow_status``: the enqueue and the start as DBOS stamped them (ms). The start stamp
    is the one DBOS's limiter counts (``now()`` of the transaction that claimed the workflow,
    on the database's clock), so the window checks use it, as Turnstile's rows use the store's
    own admission times. DBOS counts the window half-open, ``(now - period, now]``, so on
    whole-ms stamps the matching closed window is 1 ms shorter."""
    per, bound = spec["per"], spec["rate"] + spec["burst"]
    recs = [{**r, "created": stamps[r["id"]][0] / 1000, "started": stamps[r["id"]][1] / 1000}
            for r in records]
    times = sorted(r["started"] for r in recs)
    span = max(1, math.floor(seconds / per)) * per
    t0 = times[0] if times else 0.0
    counted = sum(1 for t in times if t0 <= t < t0 + span)
    allowed = allowed_from_idle("dbos", spec, span)
    # The earliest start the limiter allowed each admission: its enqueue, or when the
    # bound-th admission before it left the window, whichever is later.
    order = sorted(recs, key=lambda r: (r["started"], r["created"]))
    late, held = [], 0
    for i, r in enumerate(order):
        room = order[i - bound]["started"] + per if i >= bound else -math.inf
        held += room > r["created"]
        late.append((r["started"] - max(r["created"], room)) * 1000)
    grants = [Grant(int(r["caller"]), r["called"], r["started"], r["started"], r["queued"])
              for r in recs]
    worst = max_in_window(times, per - 0.001)
    n = len(recs)
    to_start = [(r["admitted"] - r["called"]) * 1000 for r in recs]
    stamp_to_start = [(r["admitted"] - r["started"]) * 1000 for r in recs]
    return {
        "admissions": n,
        "span_s": span,
        "counted": counted,
        "allowed": allowed,
        "per_second": counted / span,
        "utilisation": counted / allowed if allowed else math.nan,
        "max_in_tenth": max_in_window(times, per / 10 - 0.001),
        "max_in_window": worst,
        "window_bound": bound,
        "excess": max(0, worst - bound),
        "waited": held,
        "late_p50_ms": percentile(late, 50),
        "late_p99_ms": percentile(late, 99),
        "late_max_ms": max(late) if late else math.nan,
        "fifo_violations": fifo_violations(grants),
        "certain_fifo_violations": certain_fifo_violations(grants),
        "steps_per_admission": store.get("statements", 0) / n if n else math.nan,
        "transactions_per_admission": store.get("transactions", 0) / n if n else math.nan,
        "enqueue_p50_ms": percentile([(r["queued"] - r["called"]) * 1000 for r in recs], 50),
        "to_start_p50_ms": percentile(to_start, 50),
        "to_start_p99_ms": percentile(to_start, 99),
        "result_p50_ms": percentile([(r["returned"] - r["admitted"]) * 1000 for r in recs],
                                    50),
        "stamp_to_start_p50_ms": percentile(stamp_to_start, 50),
        "stamp_to_start_p99_ms": percentile(stamp_to_start, 99),
        "backoffs": store.get("backoffs", 0),
        "max_in_window_wall": max_in_window([r["admitted"] for r in recs], per),
        "max_in_tenth_wall": max_in_window([r["admitted"] for r in recs], per / 10),
    }


def dbos_stamps(url: str, queue: str) -> dict[str, tuple[int, int]]:
    """DBOS's own stamps of the queue's workflows that ran (id -> created, started; ms)."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_uuid, created_at, started_at_epoch_ms FROM dbos.workflow_status"
            " WHERE queue_name = %s AND started_at_epoch_ms IS NOT NULL", (queue,)).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def dbos_support() -> str:
    """'' when DBOS can be imported here, else why not."""
    try:
        import dbos  # noqa: F401
    except Exception as exc:
        return f"`dbos` cannot be imported ({type(exc).__name__}: {exc}; pip install dbos)"
    return ""


# -- what can run here ------------------------------------------------------------------------
def turnstile_rate_support(url: str) -> str:
    """'' when the store behind ``url`` runs rate limits, else why not."""
    import turnstile
    from turnstile import RateLimit

    try:
        client = turnstile.connect(url)
    except Exception as exc:
        return f"cannot connect: {type(exc).__name__}: {exc}"
    try:
        # Through RateLimit, so the probe calls the store exactly as the callers will.
        RateLimit(client.backend, f"bench-adm-probe-{secrets.token_hex(3)}", rate=1000,
                  per=1.0, burst=1).try_acquire("probe", enqueue=False)
    except (AttributeError, NotImplementedError) as exc:
        return f"this store has no `rate_acquire` on this branch ({type(exc).__name__})"
    except TypeError as exc:
        return (f"this store's `rate_acquire` does not take what `RateLimit` passes on this "
                f"branch ({exc})")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return ""


def dbos_label(polling: float) -> str:
    return f"DBOS queue + limiter, postgres (poll {polling:g} s)"


class AdmissionBench(Bench):
    name = "admission"
    description = __doc__ or ""
    packages = ("turnstile", "limits", "redis", "dbos")
    requires = (("limits", "pip install limits (the bench dependency group)"),)

    def options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--redis", default=None, help="Redis URL (default: a redis-server "
                            "of the run's own, else $TURNSTILE_TEST_REDIS_URL)")
        parser.add_argument("--postgres", default=os.environ.get("TURNSTILE_TEST_POSTGRES_URL"),
                            help="PostgreSQL URL (default $TURNSTILE_TEST_POSTGRES_URL)")
        parser.add_argument("--rate", type=int, default=50)
        parser.add_argument("--per", type=int, default=1, help="whole seconds (limits' unit)")
        parser.add_argument("--burst", type=int, default=5)
        parser.add_argument("--seconds", type=float, default=None, help="per row")
        parser.add_argument("--callers", default=None, help="comma-separated, e.g. 8,64")
        parser.add_argument("--only", default=None,
                            help="run only the rows whose label contains one of these "
                            "comma-separated words (e.g. dbos,sqlite)")
        parser.add_argument("--dbos-polling", default=None,
                            help="DBOS rows: queue polling intervals in s, comma-separated "
                            "(default 1,0.1; --quick: 1)")
        parser.add_argument("--dbos-result-poll", type=float, default=0.1,
                            help="DBOS rows: how often a caller polls for its workflow's "
                            "result, s (DBOS's default 1)")

    @contextlib.contextmanager
    def target(self, args: argparse.Namespace, info: dict[str, Any]) -> Iterator[Any]:
        with contextlib.ExitStack() as stack:
            folder = stack.enter_context(scratch_folder(args.tmpdir, "turnstile-bench-adm-"))
            self.env: list[str] = []
            redis = args.redis
            self.redis_note = "given with --redis"
            if redis is None:
                try:
                    redis = stack.enter_context(own_redis(folder))
                    self.redis_note = "a redis-server of the run's own"
                except Unavailable:
                    redis = os.environ.get("TURNSTILE_TEST_REDIS_URL")
                    self.redis_note = "$TURNSTILE_TEST_REDIS_URL (shared: its commandstats " \
                                      "count other clients too)"
                    if redis:
                        self.env.append("TURNSTILE_TEST_REDIS_URL=...")
            postgres = None
            if args.postgres:
                postgres, _schema = stack.enter_context(postgres_schema(args.postgres))
            self.dbos_why = dbos_support()
            dbos = None
            if not args.postgres:
                self.dbos_why = ("no PostgreSQL given (--postgres or "
                                 "$TURNSTILE_TEST_POSTGRES_URL)")
            elif not self.dbos_why:
                try:
                    dbos = stack.enter_context(dbos_database(args.postgres))
                except Exception as exc:
                    self.dbos_why = f"{type(exc).__name__}: {exc}"
            yield {
                "sqlite": f"sqlite:///{folder}/admission.db",
                "memory": "memory://",
                "redis_server": redis,
                "redis": stack.enter_context(redis_prefix(redis)) if redis else None,
                "postgres": postgres,
                "dbos": dbos,
            }

    def run(self, args: argparse.Namespace, target: dict[str, Any]) -> dict[str, Any]:
        spec = {"rate": args.rate, "per": float(args.per), "burst": args.burst}
        seconds = args.seconds or (2.5 if args.quick else 10.0)
        counts = [int(c) for c in (args.callers or "8,64").split(",")]
        server = target["redis_server"]
        limits_prefix = f"bench-adm-{secrets.token_hex(4)}"
        pollings = [float(p) for p in
                    (args.dbos_polling or ("1" if args.quick else "1,0.1")).split(",")]
        dbos_why = getattr(self, "dbos_why", "")
        contenders: list[tuple[str, str, str | None, str, str]] = [
            # label, library, url, store, why not available
            ("turnstile sqlite", "turnstile", target["sqlite"], "sqlite", ""),
            ("turnstile memory (1 process)", "turnstile", target["memory"], "memory", ""),
            ("turnstile redis", "turnstile", target["redis"], "redis",
             "" if target["redis"] else "no Redis server (redis-server, --redis)"),
            ("turnstile postgres", "turnstile", target["postgres"], "postgres",
             "" if target["postgres"] else
             "no PostgreSQL given (--postgres or $TURNSTILE_TEST_POSTGRES_URL)"),
            ("limits moving window, redis", "limits", server, "redis",
             "" if server else "no Redis server (redis-server, --redis)"),
            ("limits moving window, memory (1 process)", "limits", "memory://", "memory", ""),
            *((dbos_label(p), "dbos", target["dbos"], "postgres", dbos_why)
              for p in pollings),
        ]
        dbos_options = {dbos_label(p): (p, args.dbos_result_poll) for p in pollings}
        if args.only:
            words = [w.strip().lower() for w in args.only.split(",") if w.strip()]
            contenders = [c for c in contenders if any(w in c[0].lower() for w in words)]
        rows: list[dict[str, Any]] = []
        try:
            for label, library, url, store, why in contenders:
                if not why and library == "turnstile" and store in ("redis", "postgres"):
                    why = turnstile_rate_support(url or "")
                for n in counts:
                    base = {"label": label, "library": library, "store": store, "callers": n}
                    if why:
                        rows.append({**base, "available": False, "note": why})
                        continue
                    rows.append({**base, "available": True,
                                 **self._row(library, store, url or "", server, n, spec,
                                             seconds, limits_prefix,
                                             dbos_options.get(label))})
        finally:
            if server:
                delete_redis_keys(server, f"{limits_prefix}*")
        ok = [r for r in rows if r["available"]]
        labels = list(dict.fromkeys(r["label"] for r in ok))

        def series(key: str) -> dict[str, list[float]]:
            by = {(r["label"], r["callers"]): r[key] for r in ok}
            return {f"{n} callers": [by.get((label, n), math.nan) for label in labels]
                    for n in counts}

        return {
            "command": command_line(self.script, args.argv, env=self.env),
            "spec": spec,
            "seconds": seconds,
            "dbos_result_poll": args.dbos_result_poll,
            "redis": self.redis_note if server else None,
            "rows": rows,
            "figures": [
                Figure("utilisation", "Admissions / what the limiter's own rule allows in "
                       "the run's whole windows (1.0 = nothing left unused)", "", "utilisation",
                       labels, series("utilisation")),
                Figure("latency", "Admission past the announced slot / reset, p50 (ms, log "
                       "scale; lower is better)", "", "ms", labels, series("late_p50_ms"),
                       logy=True),
            ],
        }

    def _row(self, library: str, store: str, url: str, server: str | None, n: int,
             spec: dict[str, Any], seconds: float, limits_prefix: str,
             dbos: tuple[float, float] | None = None) -> dict[str, Any]:
        one_process = store == "memory"
        if one_process:
            layout = [n]
        elif n <= 8:
            layout = [1] * n
        else:  # threads across a few processes
            procs = THREADS_64[0]
            if n % procs:
                raise ValueError(f"{n} callers: use a multiple of {procs} above 8")
            layout = [n // procs] * procs
        shown = (f"1 process x {n} threads" if one_process else
                 f"{len(layout)} processes" if max(layout) == 1 else
                 f"{len(layout)} processes x {max(layout)} threads")
        progress(f"{library} {store}: {n} callers ({shown}), {seconds:g} s")
        name = f"bench-adm-{secrets.token_hex(4)}"
        if library == "dbos":
            return {"layout": shown, **self._dbos_row(url, n, layout, spec, seconds, dbos)}
        # Redis commandstats around the run (server-wide: a private server counts only us).
        probe = CommandCounter(server) if store == "redis" and server else None
        contender = Contender(f"{library} {store}",
                              functools.partial(Callers, library, url, spec, 1,
                                                limits_prefix),
                              probe=probe)
        factories = [functools.partial(Callers, library, url, spec, t, limits_prefix)
                     for t in layout]
        run = _run_layout(contender, factories, name, seconds)
        records = []
        for p, r in enumerate(run.results):
            for i, recs in enumerate(r["records"]):
                for rec in recs:
                    records.append({**rec, "caller": p * 1000 + i})
        metrics = row_metrics(records, library, seconds, spec)
        commands = run.counters.get("Redis commands")
        metrics["redis_commands_per_admission"] = (
            commands / metrics["admissions"] if commands is not None and metrics["admissions"]
            else math.nan)
        return {"layout": shown, **metrics}

    def _dbos_row(self, url: str, n: int, layout: list[int], spec: dict[str, Any],
                  seconds: float, dbos: tuple[float, float] | None) -> dict[str, Any]:
        """One DBOS row: a queue of its own (fresh name) in the run's DBOS database."""
        queue = f"bench_adm_{secrets.token_hex(4)}"
        factories = [functools.partial(Callers, "dbos", url, spec, t, queue, dbos=dbos)
                     for t in layout]
        run = _run_layout(Contender("dbos postgres", factories[0]), factories, queue, seconds)
        records, store = [], {"statements": 0, "transactions": 0, "backoffs": 0}
        for p, r in enumerate(run.results):
            for k in store:
                store[k] += r["store"].get(k, 0)
            for i, recs in enumerate(r["records"]):
                for rec in recs:
                    records.append({**rec, "caller": p * 1000 + i})
        stamps = dbos_stamps(url, queue)
        missing = [r["id"] for r in records if r["id"] not in stamps]
        if missing:
            raise RuntimeError(f"DBOS has no start stamp for {len(missing)} workflows that "
                               f"returned, e.g. {missing[0]}")
        metrics = dbos_metrics(records, stamps, seconds, spec, store)
        return {**metrics, "redis_commands_per_admission": math.nan,
                "polling_s": dbos[0] if dbos else 1.0,
                "result_poll_s": dbos[1] if dbos else 1.0}

    def markdown(self, results: dict[str, Any], args: argparse.Namespace,
                 info: dict[str, Any]) -> str:
        spec = results["spec"]
        rows = results["rows"]
        ok = [r for r in rows if r["available"]]
        table = [[r["label"], r["callers"], r["layout"], r["admissions"], r["per_second"],
                  f"{r['counted']}/{r['allowed']}", r["utilisation"], r["max_in_window"],
                  r["excess"], r["max_in_tenth"], r["waited"],
                  r["late_p50_ms"], r["late_p99_ms"], r["fifo_violations"],
                  r["certain_fifo_violations"], r["steps_per_admission"],
                  r["redis_commands_per_admission"]] for r in ok]
        missing = [[r["label"], r["callers"], r["note"]] for r in rows if not r["available"]]
        bound = spec["rate"] + spec["burst"]
        lines = [
            "# Rate limits under contention: admission in line vs hit-and-sleep", "",
            *machine_lines(info, results["command"]),
            f"- limit: rate={spec['rate']} per={spec['per']:g} s burst={spec['burst']}: at most "
            f"{bound} admissions in any window of {spec['per']:g} s. Turnstile's GCRA sustains "
            f"`rate / per` = {spec['rate'] / spec['per']:g}/s; `limits`' moving window is given "
            f"the same window bound ({bound} per {spec['per']:g} s), which it can sustain",
            f"- {results['seconds']:g} s per row, callers in a closed loop (each asks again as "
            "soon as it is admitted; no work)",
            f"- Redis: {results['redis'] or 'none'}; SQLite: a file in the scratch folder",
            "",
            "## Results", "",
            markdown_table(["contender", "callers", "layout", "admissions", "admitted/s",
                            "of allowed", "utilisation", f"max in any {spec['per']:g} s",
                            "excess", f"max in any {spec['per'] / 10:g} s", "waited",
                            "late p50 ms", "late p99 ms", "FIFO violations",
                            "certain", "store calls / admission",
                            "Redis commands / admission"], table),
            "",
        ]
        if missing:
            lines += ["Not available in this run:", "",
                      markdown_table(["contender", "callers", "why"], missing), ""]
        lines += [
            "*admitted/s*, *of allowed*, *utilisation*: admissions in the run's whole windows "
            "from the first admission (`[t0, t0 + k * per)`), per second, and against the most "
            "the contender's own rule allows there from idle: GCRA `burst - 1 + k * rate` "
            "(`burst` at once, then one every `per / rate`), the moving window `k * (rate + "
            "burst)`. "
            "*max in any window*: the most admission times in any closed window of `per` "
            "(Turnstile: the store's own admission times; `limits`: the wall clock just before "
            "the successful `hit()`, the clock it stamps the hit with); *excess* = max(0, that "
            f"- {bound}). *max in any {spec['per'] / 10:g} s*: how bunched admissions are "
            "(what downstream sees at once). *waited*: admissions that were told to wait at "
            "least once. *late*: "
            "for those, admission time minus the time the limiter last announced: Turnstile's "
            "slot (`now + retry_after` of the store's last answer) and `limits`' reset "
            "(`get_window_stats().reset_time`, when the oldest hit leaves the window: when a "
            "hit would have been allowed); a `limits` caller that sleeps to its reset and is "
            "refused again (another caller got there first) starts over from the new reset, so "
            "its time lost to the race shows as more store calls, not here. *FIFO violations*: "
            "admissions that went before a caller who had called more than 1 ms earlier "
            "(call times are the wall clock); *certain*: before a caller the store had "
            "already confirmed in line before this one called (Turnstile and DBOS; `-` where "
            "the limiter has no line). *store calls*: counted client-side (Turnstile "
            "`rate_acquire` + `rate_leave`; `limits` `hit` + `get_window_stats`; DBOS: SQL "
            "statements); *Redis "
            "commands*: `INFO commandstats` delta over the run, scripts' inner commands "
            "included. The DBOS rows read these columns as set out under *DBOS queues with a "
            "limiter* below.", "",
            "## Against the targets", "",
        ]
        for r in ok:
            if r["library"] != "turnstile":
                continue
            util_ok = r["utilisation"] >= 0.98 and r["excess"] == 0
            late_ok = r["late_p50_ms"] <= 2.0 if r["late_p50_ms"] == r["late_p50_ms"] else None
            lines.append(
                f"- {r['label']}, {r['callers']} callers: utilisation {r['utilisation']:.1%} "
                f"with {r['excess']} excess ({'met' if util_ok else 'not met'}: >= 98%, 0 "
                f"excess); p50 past the slot {r['late_p50_ms']:.2f} ms "
                f"({'met' if late_ok else 'not met' if late_ok is not None else 'no waits'}: "
                "<= 2 ms)")
        lines += ["", "## Reading the results", ""]
        lines += self._reading(ok, spec)
        lines += ["", "## DBOS queues with a limiter", ""]
        lines += self._dbos_section(results, info)
        return "\n".join(lines) + "\n"

    def _dbos_section(self, results: dict[str, Any], info: dict[str, Any]) -> list[str]:
        spec, rows = results["spec"], results["rows"]
        dbos = [r for r in rows if r["library"] == "dbos"]
        ran = [r for r in dbos if r["available"]]
        if not ran:
            why = dbos[0]["note"] if dbos else "no DBOS rows asked for"
            return [f"Not measured in this run: {why}."]
        bound, per = spec["rate"] + spec["burst"], spec["per"]
        version = info["versions"].get("dbos", "?")
        pollings = ", ".join(f"{p:g} s" for p in dict.fromkeys(r["polling_s"] for r in ran))
        table = [[r["label"], r["callers"], r["enqueue_p50_ms"], r["to_start_p50_ms"],
                  r["to_start_p99_ms"], r["stamp_to_start_p50_ms"], r["stamp_to_start_p99_ms"],
                  r["result_p50_ms"], r["max_in_window_wall"],
                  r["max_in_tenth_wall"], r["steps_per_admission"],
                  r["transactions_per_admission"], r["backoffs"]] for r in ran]
        return [
            f"DBOS Transact {version}. Each caller process runs DBOS (`DBOS.launch()`, an "
            "executor id of its own) on a database of the run's own on the same PostgreSQL "
            "server as the Turnstile row (`tt_bench_dbos_<random>`, DBOS's tables created "
            "once before the row, the database dropped after the run; system-database pool "
            "`min(10, threads + 6)` a process). Every process registers the same queue, "
            f"`DBOS.register_queue(name, limiter={{\"limit\": {bound}, \"period\": "
            f"{per:g}}}, polling_interval_sec=P)`: the window bound `limits` gets ({bound} "
            f"per {per:g} s, `rate + burst`), no concurrency limit; P = {pollings} (DBOS's "
            "default is 1 s; every process polls the queue that often, and a poll claims as "
            "many queued workflows as the window has room for, oldest first). A caller "
            "enqueues a workflow with no steps that returns its start time, waits for the "
            f"result (`get_result(polling_interval_sec={results['dbos_result_poll']:g})`; "
            "DBOS's default is 1 s, which would make the loop, not the limiter, the bound), "
            "and enqueues the next. The workflow runs in whichever process's poll claimed it.",
            "",
            "In the results table, for the DBOS rows: admission times are DBOS's own "
            "`started_at_epoch_ms` (the claiming transaction's `now()` on the database's "
            "clock, the stamp its limiter counts; the window counts use a closed window 1 ms "
            "shorter, as DBOS counts `(now - period, now]` on whole ms). *waited*: "
            "admissions whose window was full when they were enqueued. *late*: every "
            "admission, start minus the earliest the limiter allowed it: its enqueue "
            "(`created_at`), or when the admission "
            f"{bound} before it left the window, whichever is later, so it is mostly the wait "
            "for a poll. *FIFO*: call = before `enqueue`; *certain*: overtook a workflow whose "
            "`enqueue` had returned (committed in the queue) before this one was enqueued. "
            "DBOS claims the oldest queued workflows by `created_at`, in a REPEATABLE READ "
            "transaction that locks them `FOR UPDATE NOWAIT`, so a later-enqueued workflow "
            "can be claimed first only by a claim whose snapshot came after the earlier one's "
            "claim had committed; such a claim carries the earlier stamp only because the "
            "stamp is its transaction's start (`now()`), taken before its first query (a "
            "thread descheduled between the two on a loaded machine): a *certain* violation "
            "by the stamps is that, not the queue's order. "
            "*store calls*: SQL statements DBOS's SQLAlchemy engines executed in all caller "
            "processes (callers, queue pollers, workflow executors, result polling) over each "
            "process's run, counted client-side.",
            "",
            markdown_table(["contender", "callers", "enqueue p50 ms", "enqueue to start p50 ms",
                            "p99 ms", "stamp to start p50 ms", "p99 ms",
                            "start to result p50 ms",
                            f"max in any {per:g} s (wall)",
                            f"max in any {per / 10:g} s (wall)", "SQL statements / admission",
                            "transactions / admission", "poll back-offs"], table),
            "",
            "*enqueue*: the `enqueue()` call; *enqueue to start*: from calling `enqueue()` to "
            "the workflow's first line (wall clock; both on this machine); *stamp to start*: "
            "from DBOS's start stamp (the claiming transaction's `now()`, the time its limiter "
            "counts) to the workflow's first line: the claiming transaction's own time plus "
            "the wait for an executor thread in the claiming process; *start to result*: "
            "from the workflow's first line to `get_result()` returning in the caller; *max "
            "in any window (wall)*: by the workflows' own start times, what downstream sees: "
            "the limiter counts stamps, so when one claim's workflows start late (above) and "
            "the next claim's on time, more than the bound can start within one window. "
            "*poll back-offs*: DBOS's \"Contention detected in queue thread\" warnings in "
            "all processes: a poll whose claim conflicted with another process's "
            "(serialization failure), after which that process doubles its polling interval "
            "and eases it back by 10% a poll.",
        ]

    def _reading(self, ok: list[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
        out = []
        for n in sorted({r["callers"] for r in ok}):
            ts = next((r for r in ok if r["callers"] == n and r["label"] == "turnstile sqlite"),
                      None)
            lim = next((r for r in ok if r["callers"] == n and r["library"] == "limits"
                        and r["store"] == "redis"), None)
            if ts and lim:
                out.append(
                    f"- **{n} callers**: Turnstile on SQLite admitted {ts['per_second']:.1f}/s "
                    f"({ts['utilisation']:.1%} of what its rule allows) with "
                    f"{ts['steps_per_admission']:.2f} store steps per admission and "
                    f"{ts['fifo_violations']} FIFO violations; `limits` on Redis admitted "
                    f"{lim['per_second']:.1f}/s ({lim['utilisation']:.1%} of what its rule "
                    f"allows) with {lim['steps_per_admission']:.2f} "
                    f"calls ({lim['redis_commands_per_admission']:.1f} Redis commands) per "
                    f"admission and {lim['fifo_violations']} FIFO violations; max in a "
                    f"window {lim['max_in_window']} (excess {lim['excess']}), max in a tenth "
                    f"of one {lim['max_in_tenth']} against Turnstile's {ts['max_in_tenth']}.")
                if ts["fifo_violations"] and ts["certain_fifo_violations"] == 0:
                    out.append(
                        f"  Turnstile's {ts['fifo_violations']} FIFO violations at {n} callers "
                        "are the call-time heuristic's (on 2 cores a caller is often "
                        "descheduled, and threads of one process wait for the GIL, between "
                        "reading the clock and reaching the store); none is "
                        "certain: no caller went before one the store had already put in "
                        "line.")
        over = [r for r in ok if r["library"] == "limits" and r["excess"]]
        if over:
            out.append(
                "- `limits`' excess ("
                + ", ".join(f"{r['max_in_window']} in a window, {r['store']}, {r['callers']} "
                            "callers" for r in over)
                + ") is by the callers' clocks: `limits` stamps each hit with the caller's "
                "`time.time()` and its Redis script trusts the stamp and keeps entries in "
                "the order the requests arrive, so a caller descheduled between stamping and "
                "sending can put one more in a window by the stamps. It is not checked "
                "against a server clock here.")
        for r in ok:
            if r["library"] != "dbos":
                continue
            out.append(
                f"- **{r['label']}, {r['callers']} callers**: admitted {r['per_second']:.1f}/s "
                f"({r['utilisation']:.1%} of what its rolling window allows), max in a window "
                f"{r['max_in_window']} by DBOS's stamps (excess {r['excess']}) and "
                f"{r['max_in_window_wall']} by the workflows' own start times; each start "
                f"{r['late_p50_ms']:.0f} ms (p50; p99 {r['late_p99_ms']:.0f} ms) after the "
                f"limiter allowed it, {r['to_start_p50_ms']:.0f} ms from `enqueue()` "
                f"(p50); {r['steps_per_admission']:.1f} SQL statements and "
                f"{r['transactions_per_admission']:.1f} transactions per admission; FIFO "
                f"violations {r['fifo_violations']} (certain {r['certain_fifo_violations']}).")
        dbos = [r for r in ok if r["library"] == "dbos"]
        if dbos:
            late = [r["late_p50_ms"] for r in dbos]
            sql = [r["steps_per_admission"] for r in dbos]
            certain = sum(r["certain_fifo_violations"] or 0 for r in dbos)
            order = ("the queue keeps enqueue order (no certain FIFO violation)" if not certain
                     else f"the queue keeps enqueue order: the {certain} certain FIFO "
                     "violations are by DBOS's stamps, not its order (see below)")
            out.append(
                "- DBOS's limiter is a rolling window like `limits`', applied when a process "
                "polls the queue: one transaction claims as many of the oldest queued "
                "workflows as the window has room for. So a workflow waits for the next poll "
                f"of any process (late p50 {min(late):.0f} to {max(late):.0f} ms across its "
                "rows), a claim starts several at once (max in a tenth of the window), and "
                f"{order}. An admission costs "
                f"{min(sql):.1f} to {max(sql):.1f} SQL statements: the enqueue, the claim, the "
                "workflow's status and result writes, the caller's result polls, and every "
                "process's polls of the queue.")
        out.append(
            "- The moving window admits in bursts: every refused caller sleeps to the same "
            "reset and they race; whoever hits first wins (no order), and a whole window's "
            "worth can go at once, so downstream sees the full `rate + burst` at one instant. "
            "Turnstile spaces admissions `per / rate` apart after the burst, in arrival "
            "order, two store calls each (join the line, then one at the slot); it gives up "
            "the `burst` extra per window that the moving "
            "window can sustain (GCRA's long-run rate is `rate`).")
        return out

    def sane(self, results: dict[str, Any]) -> bool:
        bad = [r for r in results["rows"]
               if r["available"] and r["library"] == "turnstile" and r["excess"]]
        if bad:
            print("TURNSTILE ADMITTED MORE THAN rate + burst IN A WINDOW", file=sys.stderr)
        return not bad


def _run_layout(contender: Contender, factories: list[Any], name: str,
                seconds: float) -> Any:
    """:func:`run_workers` with one factory per process (processes differ in threads)."""
    sizes = {f.args[3] for f in factories}
    if len(sizes) == 1:
        c = Contender(contender.label, factories[0], probe=contender.probe)
        return run_workers(c, _callers_job, [(name, seconds)] * len(factories),
                           timeout=seconds + 180)
    raise ValueError("processes of one row must have the same number of threads")


if __name__ == "__main__":
    sys.exit(main(AdmissionBench()))
