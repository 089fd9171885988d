#!/usr/bin/env python3
"""The HTTP service (``turnstile serve``) against the same operations in-process on the same
store.

    python benchmarks/bench_http.py            # full run, writes benchmarks/results/http.md
    python benchmarks/bench_http.py --quick    # tiny sizes, writes no file (CI)

Store: ``--store URL``, else ``$TURNSTILE_TEST_REDIS_URL`` under a fresh key prefix (deleted
afterwards), else a SQLite file in a scratch folder. One service instance (one process,
started by the script on a free port, no tokens, loopback only) serves that store.

Measured, each over HTTP (``http://`` URL, the library's HTTP backend) and in-process (the
store's URL directly):

* **requests/s**: C clients (asyncio tasks of ``turnstile.aio`` clients, spread over two
  processes when C > 1), each a try-acquire (``acquire_nowait``) + release of a name of its
  own in a loop, for ``--seconds``; pairs/s and p50/p99 of one pair. The service's CPU time
  over the run (``/proc``) says how much of a core it used;
* **hand-over through long-poll**: the lock benchmarks' hand-over scenario (P processes on
  one name, 2 ms critical sections) with the sync client: over HTTP a blocked acquire
  long-polls ``/v1/semaphores/wait`` and is answered when the store wakes the service;
* **uncontended**: one process, ``with lock.acquire():`` in a loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turnstile_bench import (
    Bench,
    Contender,
    TurnstileLock,
    command_line,
    handover_table,
    machine_lines,
    main,
    markdown_table,
    no_overlaps,
    percentile,
    run_handover,
    run_uncontended,
    run_workers,
    uncontended_table,
)
from turnstile_bench.plots import Figure
from turnstile_bench.servers import redis_prefix, scratch_folder
from turnstile_bench.workers import progress

TICK = os.sysconf("SC_CLK_TCK")


def runqueue_wait(pid: int | str = "self") -> float:
    """Seconds a process has spent runnable but waiting for a core (``/proc/PID/schedstat``,
    second field); NaN where the kernel does not say."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (and its waited-for children) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


@contextlib.contextmanager
def service(store: str, folder: Path) -> Iterator[tuple[str, int]]:
    """``turnstile serve`` on ``store``, a free port, loopback; yields (URL, pid)."""
    ready = folder / f"ready-{secrets.token_hex(3)}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnstile.server", "--url", store, "--port", "0",
         "--ready-file", str(ready), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"turnstile serve did not start: {proc.stderr.read()[-2000:]}")
            time.sleep(0.05)
        yield ready.read_text().strip(), proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        ready.unlink(missing_ok=True)


def _rate_job(adapter: Any, args: tuple[str, int, float], go: float) -> dict[str, Any]:
    """``tasks`` asyncio tasks on one ``turnstile.aio`` client, each acquire_nowait + release
    of its own name until ``go + seconds``; returns every pair's duration and the CPU
    seconds this client process used meanwhile."""
    url, tasks, seconds = args

    async def run() -> list[float]:
        import turnstile.aio

        client = await turnstile.aio.connect(url)
        pid = os.getpid()
        clock = time.monotonic
        stop = go + seconds
        out: list[float] = []

        async def one(i: int) -> None:
            lock = client.lock(f"bench-rate:{pid}:{i}:{secrets.token_hex(3)}")
            while True:  # at least one pair each, however slow the machine
                t0 = clock()
                lease = await lock.acquire_nowait()
                await lease.release()
                out.append(clock() - t0)
                if clock() >= stop:
                    break

        try:
            await asyncio.gather(*(one(i) for i in range(tasks)))
        finally:
            await client.close()
        return out

    cpu0, wait0 = time.process_time(), runqueue_wait()
    pairs = asyncio.run(run())
    return {"pairs": pairs, "cpu": time.process_time() - cpu0, "wait": runqueue_wait() - wait0,
            "elapsed": time.monotonic() - go}


def _raw_job(adapter: Any, args: tuple[str, int, float], go: float) -> dict[str, Any]:
    """The same pairs without the library's HTTP client: ``tasks`` asyncio streams, each a
    keep-alive connection of its own sending each request in one write (the JSON API,
    ``POST /v1/locks/acquire`` then ``/v1/locks/release``). Separates the service's cost
    from the client's."""
    url, tasks, seconds = args
    host, port = url.split("//", 1)[1].rsplit(":", 1)

    async def run() -> list[float]:
        clock = time.monotonic
        stop = go + seconds
        out: list[float] = []

        async def request(reader: Any, writer: Any, path: str, body: bytes) -> None:
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                         + body)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"the service answered {head[:40]!r}")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)

        async def one(i: int) -> None:
            reader, writer = await asyncio.open_connection(host, int(port))
            name = f"bench-raw:{os.getpid()}:{i}:{secrets.token_hex(3)}"
            acquire = json.dumps({"name": name, "holder": "h", "ttl": 30}).encode()
            release = json.dumps({"name": name, "holder": "h"}).encode()
            try:
                while True:
                    t0 = clock()
                    await request(reader, writer, "/v1/locks/acquire", acquire)
                    await request(reader, writer, "/v1/locks/release", release)
                    out.append(clock() - t0)
                    if clock() >= stop:
                        break
            finally:
                writer.close()

        await asyncio.gather(*(one(i) for i in range(tasks)))
        return out

    cpu0, wait0 = time.process_time(), runqueue_wait()
    pairs = asyncio.run(run())
    return {"pairs": pairs, "cpu": time.process_time() - cpu0, "wait": runqueue_wait() - wait0,
            "elapsed": time.monotonic() - go}


RAW = "HTTP service, minimal client"  # the library's client left out: raw keep-alive streams

# Where the service's CPU goes: each sampled stack is charged to the deepest frame that
# matches one of these (first match from the leaf up), in this order of patterns.
PROFILE_PARTS = (
    ("store client (redis-py, psycopg, sqlite3, turnstile backends)",
     ("redis/", "psycopg", "sqlite3", "turnstile/_async/backends", "turnstile/stores",
      "turnstile/_core")),
    ("JSON", ("json/",)),
    ("turnstile service handlers", ("turnstile/server/",)),
    ("Starlette (routing, request, response)", ("starlette/",)),
    ("uvicorn / h11 / httptools (HTTP, transport)", ("uvicorn/", "h11/", "httptools")),
    ("asyncio event loop (py-spy counts its wait in select too)", ("asyncio/", "selectors.py")),
)


def profile_service(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the service (``--nonblocking``: it is not paused) for ``seconds``;
    None when py-spy is not installed or may not attach."""
    import shutil

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return None
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate",
         "250", "--format", "raw", "--nonblocking", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def profile_shares(raw: Path) -> dict[str, float]:
    """Share of the service's CPU samples per part (:data:`PROFILE_PARTS`)."""
    counts: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        part = "other"
        for frame in reversed(stack.split(";")):
            found = next((name for name, pats in PROFILE_PARTS if any(p in frame for p in pats)),
                         None)
            if found:
                part = found
                break
        counts[part] = counts.get(part, 0) + int(n)
    return {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])} if total else {}


def run_rate(label: str, url: str, clients: int, seconds: float,
             server_pid: int | None, profile: Path | None = None,
             job: Any = _rate_job) -> dict[str, Any]:
    processes = 1 if clients == 1 else 2
    per = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    progress(f"  requests/s  {label}  {clients} clients")
    # The service's CPU is read while the clients wait at the start line and once they are
    # done (the contender's probe), so their start-up is not counted.
    probe = ((lambda: {"cpu": cpu_seconds(server_pid), "wait": runqueue_wait(server_pid)})
             if server_pid else None)
    contender = Contender(label, functools.partial(TurnstileLock, url), probe=probe)
    # Start sampling a little after the workers (their spawn takes a second or two).
    spy = None
    if profile is not None and server_pid:
        spy = profile_service(server_pid, seconds, profile)
    run = run_workers(contender, job, [(url, n, seconds) for n in per],
                      timeout=seconds + 120)
    wall = max(r["elapsed"] for r in run.results)  # from the start line to the last pair
    shares: dict[str, float] = {}
    if spy is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(timeout=30)
        if profile is not None and profile.exists():
            shares = profile_shares(profile)
    cpu = run.counters.get("cpu", float("nan"))
    pairs = [d for r in run.results for d in r["pairs"]]
    client_cpu = sum(r["cpu"] for r in run.results)
    client_wait = sum(r["wait"] for r in run.results)
    return {
        "label": label,
        "clients": clients,
        "pairs": len(pairs),
        "per_second": len(pairs) / wall,
        "p50_ms": percentile(pairs, 50) * 1000,
        "p99_ms": percentile(pairs, 99) * 1000,
        # Requests: try-acquire and release are one request each.
        "service_cpu_s": cpu,
        "client_cpu_share": client_cpu / wall,
        "client_cpu_ms_per_request": client_cpu * 1000 / (2 * len(pairs)) if pairs
        else float("nan"),
        # Runnable but waiting for a core (the machine's other load): seconds per second.
        "client_runq_share": client_wait / wall,
        "service_runq_share": run.counters.get("wait", float("nan")) / wall,
        "service_cpu_share": cpu / wall if server_pid else float("nan"),
        "service_cpu_ms_per_request": cpu * 1000 / (2 * len(pairs)) if pairs and server_pid
        else float("nan"),
        "profile": shares,
    }


class HttpBench(Bench):
    name = "http"
    description = __doc__ or ""
    packages = ("turnstile", "starlette", "uvicorn", "httpx", "redis")
    requires = (("starlette", "pip install 'turnstile-locks[server]'"),
                ("httpx", "pip install 'turnstile-locks[http]'"))

    def options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--store", default=None,
                            help="store URL behind the service (default: "
                            "$TURNSTILE_TEST_REDIS_URL, else SQLite in --tmpdir)")
        parser.add_argument("--clients", default=None, help="comma-separated, e.g. 1,8,64")
        parser.add_argument("--seconds", type=float, default=None, help="per requests/s run")
        parser.add_argument("--waiters", default=None, help="hand-over waiters, e.g. 2,8")

    @contextlib.contextmanager
    def target(self, args: argparse.Namespace, info: dict[str, Any]) -> Iterator[Any]:
        with contextlib.ExitStack() as stack:
            folder = stack.enter_context(scratch_folder(args.tmpdir, "turnstile-bench-http-"))
            self.folder = folder
            store = args.store or os.environ.get("TURNSTILE_TEST_REDIS_URL")
            from turnstile._core.urls import redact

            self.env = ([] if args.store or not store
                        else [f"TURNSTILE_TEST_REDIS_URL={redact(store)}"])
            if store and store.startswith("redis"):
                store = stack.enter_context(redis_prefix(store))
            elif not store:
                store = f"sqlite:///{folder}/bench.db"
            self.store_shown = redact(store)
            url, pid = stack.enter_context(service(store, folder))
            yield store, url, pid

    def run(self, args: argparse.Namespace, target: tuple[str, str, int]) -> dict[str, Any]:
        store, http, pid = target
        quick = args.quick
        clients = [int(c) for c in (args.clients or ("1,8" if quick else "1,8,64")).split(",")]
        seconds = args.seconds or (1.0 if quick else 5.0)
        waiters = [int(w) for w in (args.waiters or ("2" if quick else "2,8")).split(",")]
        kind = store.split(":", 1)[0]
        contenders = [
            Contender(f"in-process {kind}", functools.partial(TurnstileLock, store)),
            Contender(f"HTTP service on {kind}", functools.partial(TurnstileLock, http)),
        ]
        rates = []
        for c in clients:
            rates.append(run_rate(contenders[0].label, store, c, seconds, None))
            profile = self.folder / "profile.txt" if c == max(clients) and not quick else None
            rates.append(run_rate(contenders[1].label, http, c, seconds, pid, profile))
            rates.append(run_rate(RAW, http, c, seconds, pid, job=_raw_job))
        progress("uncontended")
        unc = run_uncontended(contenders, iterations=100 if quick else 2000,
                              max_seconds=0.5 if quick else 3.0, trials=1 if quick else 3)
        handover = []
        for w in waiters:
            progress(f"handover, {w} waiters")
            handover += run_handover(contenders, processes=w + 1,
                                     rounds=4 if quick else max(10, 160 // (w + 1)),
                                     hold=0.002, max_seconds=2.5 if quick else 20.0)
        labels = [c.label for c in contenders] + [RAW]
        figure = Figure(
            "requests", "try-acquire + release pairs per second by clients (higher is better)",
            "clients", "pairs/s", clients,
            {label: [r["per_second"] for r in rates if r["label"] == label] for label in labels},
        )
        return {
            "command": command_line("bench_http.py", args.argv, env=self.env),
            "store": self.store_shown,
            "rates": rates,
            "uncontended": unc,
            "handover": handover,
            "figures": [figure],
        }

    def markdown(
        self, results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]
    ) -> str:
        rates = results["rates"]
        inproc = {r["clients"]: r for r in rates if r["label"].startswith("in-process")}
        rows = [[r["label"], r["clients"], r["per_second"],
                 r["per_second"] / inproc[r["clients"]]["per_second"]
                 if r["clients"] in inproc else float("nan"),
                 r["p50_ms"], r["p99_ms"], r["client_cpu_share"],
                 r["client_cpu_ms_per_request"], r["client_runq_share"],
                 r["service_cpu_share"], r["service_runq_share"],
                 r["service_cpu_ms_per_request"]] for r in rates]
        http_rows = [r for r in rates if not r["label"].startswith("in-process")]
        # Where the service worked hardest says most about its own bound.
        top = max(http_rows, key=lambda r: r["service_cpu_share"]) if http_rows else None
        handover = results["handover"]
        base = next((r.label for r in results["uncontended"] if r.label.startswith("in-")), None)
        lines = [
            "# HTTP service benchmark", "",
            *machine_lines(info, results["command"]),
            f"- store behind the service and in-process: `{results['store']}`; one "
            "`turnstile serve` process (uvicorn, one event loop) on loopback",
            "- the machine is shared with other jobs (up to 8 agents' test runs on 2 cores): "
            "compare rows of this run only; ratios are what count.", "",
            "## Try-acquire + release, requests per second per instance", "",
            "Each pair is two requests (`acquire` without waiting, `release`). Clients are "
            "asyncio tasks (two client processes when more than one).", "",
            markdown_table(["path", "clients", "pairs/s", "vs in-process", "p50 ms", "p99 ms",
                            "clients' CPU (cores)", "clients' CPU ms / request",
                            "clients waiting for a core",
                            "service CPU (cores)", "service waiting for a core",
                            "service CPU ms / request"], rows),
            "",
            "*waiting for a core*: seconds per second that the processes were runnable but "
            "not running (`/proc/PID/schedstat`), i.e. what the machine's other load cost them; "
            "summed over the client processes.",
            "",
            "## Hand-over through long-poll", "",
            handover_table(handover, baseline=base), "",
            "## Uncontended (`with lock.acquire():`, one process)", "",
            uncontended_table(results["uncontended"], baseline=base), "",
            "## Reading the results", "",
        ]
        if top is not None:
            waits = top["service_runq_share"]
            if top["service_cpu_share"] >= 0.6:
                lines.append(
                    f"- **What bounds it: the service's one core.** At {top['clients']} clients "
                    f"the service ran {top['per_second'] * 2:,.0f} requests/s using "
                    f"{top['service_cpu_share']:.2f} of a core "
                    f"({top['service_cpu_ms_per_request']:.2f} ms of CPU per request): one "
                    "Python process with one event loop, so its ceiling is one core divided by "
                    "that CPU per request (HTTP parsing, JSON, the Starlette/uvicorn stack, the "
                    "store call). Instances keep no state: run several behind a load balancer "
                    "to go past it.")
            elif waits == waits and waits > top["service_cpu_share"]:
                lines.append(
                    f"- **What bounds it here: the machine, not the service.** At "
                    f"{top['clients']} clients the service used {top['service_cpu_share']:.2f} "
                    f"of a core ({top['service_cpu_ms_per_request']:.2f} ms of CPU per request) "
                    f"but spent {waits:.2f} s per second runnable and waiting for a core "
                    f"(the clients {top['client_runq_share']:.2f}): on this shared 2-core "
                    "machine every hop of a request (client, service, store, service, client) "
                    "waits for the scheduler, and an HTTP request has two more hops than an "
                    "in-process call. The service's own ceiling is 1000 / (CPU ms per request) "
                    f"= {1000 / top['service_cpu_ms_per_request']:,.0f} requests/s per core; "
                    "measure on an idle host for the absolute figure.")
            else:
                lines.append(
                    f"- **What bounds it: latency, not the service's CPU.** At {top['clients']} "
                    f"clients the service used only {top['service_cpu_share']:.2f} of a core "
                    f"({top['service_cpu_ms_per_request']:.2f} ms of CPU per request), so the "
                    "rate is set by each client waiting for one request at a time (round trip "
                    "through the client's HTTP stack, the service and the store); more clients "
                    "raise it until the service's core is full: 1000 / (CPU ms per request) "
                    "requests/s.")
        raw = {r["clients"]: r for r in rates if r["label"] == RAW}
        lib = {r["clients"]: r for r in rates if r["label"].startswith("HTTP service on")}
        if raw and lib:
            lines.append(
                "- **Client or service?** With a minimal client (one keep-alive stream per "
                "client, each request one write) the same service answered "
                + ", ".join(f"{raw[c]['per_second']:,.0f} pairs/s at {c} clients "
                            f"({raw[c]['per_second'] / lib[c]['per_second']:.1f}x the library's "
                            "client)" for c in sorted(raw) if c in lib)
                + "; the clients' CPU per request was "
                + ", ".join(f"{lib[c]['client_cpu_ms_per_request']:.2f} ms with the library's "
                            f"client against {raw[c]['client_cpu_ms_per_request']:.2f} ms minimal "
                            f"({c} clients)" for c in sorted(raw) if c in lib)
                + ". Where the ratio is well above 1, the bound is the client: the library's "
                "HTTP backend (`turnstile.aio` over httpx's request and connection-pool "
                "machinery) spends that much CPU per request, and on a machine short of cores "
                "it also waits for one that much longer.")
        profiled = next((r for r in rates if r.get("profile")), None)
        if profiled is not None:
            lines += ["", f"Where the service's CPU went at {profiled['clients']} clients "
                      "(py-spy, sampled stacks charged to the deepest frame of each part):", "",
                      markdown_table(["part", "share of CPU samples"],
                                     [[k, f"{v:.0%}"] for k, v in profiled["profile"].items()]),
                      ""]
        pairs = [(h, next((x for x in handover if x.processes == h.processes
                            and x.label.startswith("in-")), None))
                 for h in handover if h.label.startswith("HTTP")]
        for h, i in pairs:
            if i is not None:
                lines.append(
                    f"- **Hand-over, {h.processes - 1} waiters**: p50 {h.gap_p50_ms:.2f} ms over "
                    f"HTTP against {i.gap_p50_ms:.2f} ms in-process "
                    f"(+{h.gap_p50_ms - i.gap_p50_ms:.2f} ms: the release request, the "
                    "service's wake-up of the long poll and its answer, then the waiter's "
                    "claim request).")
        return "\n".join(lines)

    def sane(self, results: dict[str, Any]) -> bool:
        return no_overlaps({**results, "webhooks": []})


if __name__ == "__main__":
    sys.exit(main(HttpBench()))
