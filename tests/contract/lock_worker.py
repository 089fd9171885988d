"""Scenarios the contract suite runs in separate OS processes (or, for ``memory://``, which
lives in one process, in threads sharing the test's client).

As a process::

    python -m tests.contract.lock_worker '{"url": ..., "scenario": ..., "params": {...}}'

connects with ``turnstile.connect(url)`` (or ``turnstile.aio.connect`` for ``async_*``
scenarios), then reports what happens as JSON lines on stdout (``{"event": kind, ...}``) and
takes commands as lines on stdin. Every time is ``time.monotonic()``, which on Linux is one
clock for all processes of the host, so intervals recorded by different processes compare.
Every wait is bounded so a stuck worker ends by itself.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import turnstile
import turnstile.aio

COMMAND_TIMEOUT = 60.0
ACQUIRE_TIMEOUT = 60.0


class Context:
    """What a scenario sees: a client, a way to report, a way to be told."""

    def __init__(
        self,
        client: Any,
        emit: Callable[[dict[str, Any]], None],
        command: Callable[[float], str],
        cpu_time: Callable[[], float],
    ) -> None:
        self.client = client
        self._emit = emit
        self._command = command
        self.cpu_time = cpu_time

    def emit(self, kind: str, **data: Any) -> None:
        self._emit({"event": kind, "t": time.monotonic(), **data})

    def command(self, timeout: float = COMMAND_TIMEOUT) -> str:
        """The next line sent to this worker ('' if none came within ``timeout``)."""
        return self._command(timeout)

    async def acommand(self, within: float = COMMAND_TIMEOUT) -> str:
        return await asyncio.to_thread(self._command, within)


def _primitive(
    client: Any,
    name: str,
    limit: int,
    ttl: float,
    key: str | None = None,
    per_key: int | None = None,
    **kw: Any,
) -> Any:
    if per_key is not None:  # one key of a semaphore group whose total is `limit`
        assert key is not None
        return client.semaphore_group(name, per_key, limit, ttl, **kw).key(key)
    if limit == 1:
        return client.lock(name, ttl, **kw)
    return client.semaphore(name, limit, ttl, **kw)


def _bump(counter: str) -> None:
    """A deliberately racy read-modify-write of a file: only mutual exclusion keeps it exact."""
    path = Path(counter)
    value = int(path.read_text() or "0")
    time.sleep(0.001)
    path.write_text(str(value + 1))


# -- scenarios ---------------------------------------------------------------------------


def critical(
    ctx: Context,
    name: str,
    limit: int,
    ttl: float,
    iterations: int,
    hold: float,
    counter: str | None = None,
) -> None:
    """Enter the critical section ``iterations`` times; record each interval and token."""
    sem = _primitive(ctx.client, name, limit, ttl)
    ctx.emit("ready")
    if ctx.command() != "go":
        raise RuntimeError("no go")
    for _ in range(iterations):
        asked = time.monotonic()
        with sem.acquire(timeout=ACQUIRE_TIMEOUT) as lease:
            start = time.monotonic()
            if counter is not None and limit == 1:
                _bump(counter)
            time.sleep(hold)
            end = time.monotonic()
            lost = lease.lost
        ctx.emit("interval", asked=asked, start=start, end=end, token=lease.token, lost=lost)
    ctx.emit("done")


def rated_critical(
    ctx: Context,
    name: str,
    limit: int,
    rate: int,
    per: float,
    burst: int,
    ttl: float,
    iterations: int,
    hold: float,
) -> None:
    """:func:`critical` on a semaphore with a rate; each interval has its start time (store
    clock) as the rate admitted it."""
    sem = ctx.client.semaphore(name, limit, ttl, rate=rate, per=per, burst=burst)
    ctx.emit("ready")
    if ctx.command() != "go":
        raise RuntimeError("no go")
    for _ in range(iterations):
        asked = time.monotonic()
        with sem.acquire(timeout=ACQUIRE_TIMEOUT) as lease:
            start = time.monotonic()
            time.sleep(hold)
            end = time.monotonic()
            lost = lease.lost
        ctx.emit(
            "interval", asked=asked, start=start, end=end, token=lease.token, lost=lost,
            started_at=lease.started_at,
        )
    ctx.emit("done")


def group_critical(
    ctx: Context,
    name: str,
    key: str,
    per_key: int,
    total: int,
    ttl: float,
    iterations: int,
    hold: float,
) -> None:
    """:func:`critical` on one key of a semaphore group; each interval names its key."""
    sem = ctx.client.semaphore_group(name, per_key, total, ttl).key(key)
    ctx.emit("ready")
    if ctx.command() != "go":
        raise RuntimeError("no go")
    for _ in range(iterations):
        asked = time.monotonic()
        with sem.acquire(timeout=ACQUIRE_TIMEOUT) as lease:
            start = time.monotonic()
            time.sleep(hold)
            end = time.monotonic()
            lost = lease.lost
        ctx.emit(
            "interval", asked=asked, start=start, end=end, token=lease.token, lost=lost, key=key
        )
    ctx.emit("done")


async def async_critical(
    ctx: Context,
    name: str,
    limit: int,
    ttl: float,
    iterations: int,
    hold: float,
    counter: str | None = None,
) -> None:
    """:func:`critical` through ``turnstile.aio``."""
    sem = _primitive(ctx.client, name, limit, ttl)
    ctx.emit("ready")
    if await ctx.acommand() != "go":
        raise RuntimeError("no go")
    for _ in range(iterations):
        asked = time.monotonic()
        async with sem.acquire(timeout=ACQUIRE_TIMEOUT) as lease:
            start = time.monotonic()
            if counter is not None and limit == 1:
                _bump(counter)
            await asyncio.sleep(hold)
            end = time.monotonic()
            lost = lease.lost
        ctx.emit("interval", asked=asked, start=start, end=end, token=lease.token, lost=lost)
    ctx.emit("done")


def wait_grant(
    ctx: Context,
    name: str,
    limit: int,
    ttl: float,
    holder: str,
    hold: float = 0.0,
    timeout: float = ACQUIRE_TIMEOUT,
    priority: int = 0,
) -> None:
    """On "go", wait in line as ``holder`` (at ``priority``); report the grant (time, token,
    CPU spent waiting), hold it for ``hold`` seconds, release it and report that."""
    sem = _primitive(ctx.client, name, limit, ttl)
    ctx.emit("ready")
    if ctx.command() != "go":
        raise RuntimeError("no go")
    cpu = ctx.cpu_time()
    asked = time.monotonic()
    ctx.emit("asking")
    try:
        lease = sem.acquire(timeout=timeout, holder=holder, priority=priority)
    except turnstile.AcquireTimeout:
        ctx.emit("timeout", waited=time.monotonic() - asked)
        return
    granted = time.monotonic()
    ctx.emit(
        "granted",
        holder=holder,
        token=lease.token,
        waited=granted - asked,
        cpu=ctx.cpu_time() - cpu,
    )
    with lease:
        time.sleep(hold)
    ctx.emit("released", holder=holder, token=lease.token)


def hold(
    ctx: Context,
    name: str,
    limit: int,
    ttl: float,
    holder: str,
    key: str | None = None,
    per_key: int | None = None,
) -> None:
    """Hold a lease (kept renewed) until told "finish"; then report whether it was lost and
    what leaving the ``with`` block raised. Used with kill -9 and SIGSTOP. With ``per_key``:
    a slot of ``key`` in a semaphore group whose total is ``limit``."""
    sem = _primitive(
        ctx.client,
        name,
        limit,
        ttl,
        key,
        per_key,
        on_lost=lambda lease: ctx.emit("on_lost", token=lease.token),
    )
    raised = None
    lease = sem.acquire(timeout=ACQUIRE_TIMEOUT, holder=holder)
    try:
        with lease:
            ctx.emit("holding", holder=holder, token=lease.token)
            command = ctx.command()
            ctx.emit("finishing", command=command, lost=lease.lost)
    except turnstile.LeaseLost as exc:
        raised = type(exc).__name__
    ctx.emit("exit", raised=raised, lost=lease.lost, token=lease.token)


def release(
    ctx: Context, name: str, limit: int, ttl: float, holder: str, token: int | None = None
) -> None:
    """Release ``holder`` (and, without a token, its place in line), as any process may."""
    sem = _primitive(ctx.client, name, limit, ttl)
    ctx.emit("released", result=sem.release(holder, token))


def ticket(
    ctx: Context, name: str, limit: int, ttl: float, holder: str, wait_ttl: float | None = None
) -> None:
    sem = _primitive(ctx.client, name, limit, ttl)
    t = sem.try_acquire(holder, wait_ttl=wait_ttl)
    ctx.emit(
        "ticket",
        acquired=t.acquired,
        position=t.position,
        token=t.lease.token if t.lease is not None else None,
    )


def tokens(ctx: Context, name: str, ttl: float, count: int) -> None:
    """Acquire and release ``name`` ``count`` times; report the tokens."""
    lock = ctx.client.lock(name, ttl)
    seen = []
    for _ in range(count):
        with lock.acquire(timeout=ACQUIRE_TIMEOUT) as lease:
            seen.append(lease.token)
    ctx.emit("tokens", tokens=seen)


def probe_names(ctx: Context, names: list[str], ttl: float) -> None:
    """For each name: is it free for us right now (acquire_nowait), and who holds it."""
    report = []
    for name in names:
        lock = ctx.client.lock(name, ttl)
        holders = [h.holder for h in lock.status().holders]
        try:
            lease = lock.acquire_nowait()
        except turnstile.AcquireTimeout:
            free = False
        else:
            free = True
            lease.release()
        report.append({"name": name, "free": free, "holders": holders})
    ctx.emit("probe", report=report)


SCENARIOS: dict[str, Callable[..., Any]] = {
    fn.__name__: fn
    for fn in (
        critical,
        async_critical,
        group_critical,
        rated_critical,
        wait_grant,
        hold,
        release,
        ticket,
        tokens,
        probe_names,
    )
}


def is_async(scenario: str) -> bool:
    return inspect.iscoroutinefunction(SCENARIOS[scenario])


# -- process entry point --------------------------------------------------------------------


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    out_lock = threading.Lock()

    def emit(event: dict[str, Any]) -> None:
        line = json.dumps(event)
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    lines: list[str] = []
    arrived = threading.Condition()

    def read_stdin() -> None:
        for line in sys.stdin:
            with arrived:
                lines.append(line.strip())
                arrived.notify_all()

    threading.Thread(target=read_stdin, daemon=True).start()

    def command(timeout: float) -> str:
        with arrived:
            if not arrived.wait_for(lambda: bool(lines), timeout):
                return ""
            return lines.pop(0)

    fn = SCENARIOS[spec["scenario"]]
    try:
        if inspect.iscoroutinefunction(fn):

            async def run() -> None:
                client = await turnstile.aio.connect(spec["url"])
                try:
                    await fn(Context(client, emit, command, time.process_time), **spec["params"])
                finally:
                    await client.close()

            asyncio.run(run())
        else:
            client = turnstile.connect(spec["url"])
            try:
                fn(Context(client, emit, command, time.process_time), **spec["params"])
            finally:
                client.close()
    except BaseException as exc:
        emit(
            {
                "event": "error",
                "t": time.monotonic(),
                "error": repr(exc),
                "traceback": traceback.format_exc(),
            }
        )
        return 1
    emit({"event": "exited", "t": time.monotonic()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
