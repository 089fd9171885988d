"""The few primitives that differ between the async and the sync flavour.

Hand-written twin of ``turnstile/_sync/_compat.py``; everything else under ``_async`` is
turned into ``_sync`` by ``scripts/unasync.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

FLAVOUR = "async"
Event = asyncio.Event
Handle = asyncio.Task[None]
sleep = asyncio.sleep
# The lease renewer task of an event loop ends as soon as nothing is held.
RENEWER_IDLE = 0.0
# A Redis waiter reading its client's subscriber connection reads this long at a time at
# most: a cancelled waiter lets its read finish first (redis_listen.py), so this bounds how
# late a cancellation takes effect.
LISTEN_READ_SLICE = 0.25


def blocking_slice(longest: float) -> float:
    """How long one blocking read on a connection may last, at most ``longest`` (the sync
    flavour cuts it short in the main thread, so that a signal handler runs soon)."""
    return longest


async def run_blocking(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a short blocking call (SQLite) in a worker thread.

    A thread cannot be stopped: if the caller is cancelled, the call still completes. Wait
    for it before letting the cancellation through, so that whatever the caller does next
    (leave the line, release) happens on the store *after* it, not before."""
    call = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        while not call.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({call})
        if not call.cancelled():
            call.exception()  # retrieved: the cancellation is what the caller gets
        raise


# Timeouts use ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11 ``wait_for``
# swallows a cancellation that arrives together with the completion of what it waits for,
# so a waiter cancelled just as it was woken would go on waiting (and take the grant).


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(max(timeout, 0.0)):
            await event.wait()
    except TimeoutError:
        return False
    return True


def spawn(fn: Callable[[], Awaitable[None]], name: str) -> asyncio.Task[None]:
    async def runner() -> None:
        await fn()

    return asyncio.get_running_loop().create_task(runner(), name=name)


async def join(handle: asyncio.Task[None]) -> None:
    if asyncio.current_task() is handle:
        return
    try:
        await handle
    except asyncio.CancelledError:
        if not handle.cancelled():
            raise


def alive(handle: asyncio.Task[None]) -> bool:
    return not handle.done()


async def stop(handle: asyncio.Task[None]) -> None:
    """Cancel a task and wait for it (if it runs on this loop; else only cancel it)."""
    if handle is asyncio.current_task() or handle.done():
        return
    loop = handle.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is running:
        handle.cancel()
        await join(handle)
    elif not loop.is_closed():
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(handle.cancel)


def context_key() -> object:
    """What one lease renewer serves: the running event loop."""
    return asyncio.get_running_loop()


def current_owner() -> object:
    """Who is inside a ``async with sem:`` block: the running task."""
    return asyncio.current_task()


def context_gone(key: object) -> bool:
    return isinstance(key, asyncio.AbstractEventLoop) and key.is_closed()


def is_flavour_function(fn: Any) -> bool:
    """Whether ``fn`` can be wrapped by this flavour's decorators (coroutine functions)."""
    return inspect.iscoroutinefunction(fn)


def prepare_socket(sock: socket.socket) -> None:
    sock.setblocking(False)


async def recv_datagram(sock: socket.socket, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(max(timeout, 0.0)):
            await loop.sock_recv(sock, 64)
    except TimeoutError:
        return False
    return True



async def finish_then_cancel(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end even if the current task is cancelled meanwhile, then
    raise that cancellation: a request already sent is answered, and so applied, before the
    caller's clean-up (e.g. a release on another connection) can overtake it."""
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):  # its own failure is not the news here
            await task
        raise


def cancel_count() -> int:
    """How many cancellations the current task has pending (0 outside a task)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def raise_if_cancelled_since(count: int) -> None:
    """Some drivers (redis-py) finish a command whose task was cancelled meanwhile and
    return its result: re-raise the cancellation they swallowed."""
    if cancel_count() > count:
        raise asyncio.CancelledError()
