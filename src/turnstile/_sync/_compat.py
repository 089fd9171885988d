"""The few primitives that differ between the async and the sync flavour.

Hand-written twin of ``turnstile/_async/_compat.py``; everything else under ``_sync`` is
generated from ``_async`` by ``scripts/unasync.py``. No event loop is ever run here.
"""

from __future__ import annotations

import inspect
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

from .._core import forks

P = ParamSpec("P")
T = TypeVar("T")

FLAVOUR = "sync"
Event = threading.Event
Handle = threading.Thread
# The lease renewer thread of a process ends after this long with nothing held.
RENEWER_IDLE = 30.0
# A Redis waiter reading its client's subscriber connection reads this long at a time at
# most (threads are not cancelled: as long as a blocked wait, like the BLPOP of a queue
# consumer; redis_listen.py).
LISTEN_READ_SLICE = 5.0
# How often the main thread, waiting, comes back to the interpreter to run a signal handler.
SIGNAL_POLL = 0.2


# Python runs signal handlers in the main thread, between steps of the interpreter: a signal
# that trips a handler just before a long wait's system call begins (or that the kernel
# hands to another thread) is acted on only when that wait ends. The waits of the main
# thread are therefore cut into slices of SIGNAL_POLL: a SIGTERM handler that raises runs
# within that, not at the end of a wait of a minute for a rate-limit slot. Other threads
# never run handlers, and wait in one piece.
def _slices(timeout: float) -> Iterator[float]:
    """The waits one wait of ``timeout`` seconds is made of: in the main thread, slices of
    at most SIGNAL_POLL until the deadline; elsewhere (or for a short wait) one piece."""
    if timeout <= SIGNAL_POLL or threading.current_thread() is not threading.main_thread():
        yield max(timeout, 0.0)
        return
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        yield min(left, SIGNAL_POLL)


def blocking_slice(longest: float) -> float:
    """How long one blocking read on a connection may last: at most ``longest``, and in the
    main thread at most SIGNAL_POLL, as every wait of the main thread (a read blocked in
    the kernel returns to the interpreter only when it ends, and the kernel may have handed
    the signal to another thread)."""
    if longest > SIGNAL_POLL and threading.current_thread() is threading.main_thread():
        return SIGNAL_POLL
    return longest


def sleep(seconds: float) -> None:
    for part in _slices(seconds):
        time.sleep(part)


def run_blocking(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return fn(*args, **kwargs)


def wait_event(event: threading.Event, timeout: float) -> bool:
    for part in _slices(timeout):
        if event.wait(part):
            return True
    return event.is_set()


def spawn(fn: Callable[[], None], name: str) -> threading.Thread:
    thread = threading.Thread(target=fn, name=name, daemon=True)
    thread.start()
    return thread


def join(handle: threading.Thread) -> None:
    if handle is threading.current_thread():
        return
    if threading.current_thread() is not threading.main_thread():
        handle.join()
        return
    # Python runs a signal's handler in the main thread, but the kernel may hand a signal
    # sent to the process to any of its threads: then the flag is set and the main thread,
    # asleep in an endless join, never looks at it (a Ctrl-C or SIGTERM ignored until the
    # thread ends, which may be never: q.work's workers wait for that very handler). A
    # join in slices returns to the interpreter now and then, which runs the handler.
    while handle.is_alive():
        handle.join(SIGNAL_POLL)


def alive(handle: threading.Thread) -> bool:
    return handle.is_alive()


def stop(handle: threading.Thread) -> None:
    """Wait for a thread that was told to stop."""
    join(handle)


def context_key() -> object:
    """What one lease renewer serves: the process (a forked child resets its renewers)."""
    return None


def current_owner() -> object:
    """Who is inside a ``with sem:`` block: this thread of this process (a forked child's
    generation differs from its parent's, so it never matches a block of the parent)."""
    return (forks.generation(), threading.get_ident())


def context_gone(key: object) -> bool:
    return False


def is_flavour_function(fn: Any) -> bool:
    """Whether ``fn`` can be wrapped by this flavour's decorators (plain callables)."""
    return callable(fn) and not inspect.iscoroutinefunction(fn)


def prepare_socket(sock: socket.socket) -> None:
    return None


def recv_datagram(sock: socket.socket, timeout: float) -> bool:
    for part in _slices(timeout):
        sock.settimeout(part)  # 0: non-blocking
        try:
            sock.recv(64)
        except (TimeoutError, BlockingIOError):
            continue
        return True
    return False



def finish_then_cancel(value: T) -> T:
    """Threads are not cancelled: the call has finished already (twin of the async one)."""
    return value


def cancel_count() -> int:
    """Threads are not cancelled: always 0 (twin of the async flavour's check)."""
    return 0


def raise_if_cancelled_since(count: int) -> None:
    return None
