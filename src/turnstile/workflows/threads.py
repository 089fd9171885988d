"""Blocking calls (boto3, urllib) from the workflow services' event loops, in threads that
never hold up the process's exit.

``asyncio.to_thread`` and a ``ThreadPoolExecutor`` run a call in a thread that the process
waits for when it exits (``asyncio.run`` shuts the default executor down and waits; the
interpreter joins every executor thread at exit). A bridge, dispatcher or deliverer told to
stop (SIGTERM) would then wait for whatever AWS or HTTP call was in flight, up to its
timeouts and retries: tens of seconds against a slow endpoint. :func:`call` runs each call in
a daemon thread of its own instead: a stopping service abandons a call still in flight, and
every such call is safe to abandon (its effect, if it had one, is found again or redone by
the at-least-once design: an SQS message is delivered again, a delivery's claim lapses and it
is sent again, an execution started under its deterministic name is adopted, a read is
simply lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a daemon thread; its result or exception. Cancelling the
    caller abandons the call: the thread runs on, and its outcome is dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.done():  # the caller was cancelled meanwhile
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def work() -> None:
        value: Any
        try:
            value, ok = fn(*args, **kwargs), True
        except Exception as exc:
            value, ok = exc, False
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, ok, value)

    name = f"turnstile-call-{getattr(fn, '__name__', 'fn')}"
    threading.Thread(target=work, name=name, daemon=True).start()
    return await future
