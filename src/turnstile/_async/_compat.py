"""The few primitives that differ between the async and the sync flavour.

Hand-written twin of ``turnstile/_sync/_compat.py``; everything else under ``_async`` is
turned into ``_sync`` by ``scripts/unasync.py``.
"""

from __future__ import annotations

import asyncio
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


async def run_blocking(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a short blocking call (SQLite) in a worker thread."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), max(timeout, 0.0))
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


def is_flavour_function(fn: Any) -> bool:
    """Whether ``fn`` can be wrapped by this flavour's decorators (coroutine functions)."""
    return inspect.iscoroutinefunction(fn)


def prepare_socket(sock: socket.socket) -> None:
    sock.setblocking(False)


async def recv_datagram(sock: socket.socket, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.sock_recv(sock, 64), max(timeout, 0.0))
    except TimeoutError:
        return False
    return True
