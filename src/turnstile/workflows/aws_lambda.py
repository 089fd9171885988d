"""Leases for AWS Lambda handlers: the ttl follows the invocation's remaining time.

    from turnstile.workflows.aws_lambda import lambda_lease, sequential_handler

    @sequential_handler(lambda event, context: f"order:{event['order_id']}")
    def handler(event, context):
        ...                                  # one invocation per order at a time, in order

    def handler(event, context):
        with lambda_lease(context, "shared-db", limit=5) as lease:
            ...

A Lambda invocation cannot outlive its timeout: when it is killed at the timeout (or its
sandbox is frozen and thrown away), nothing releases its lease. So the lease's ttl is the
invocation's remaining time (``context.get_remaining_time_in_millis()``) plus a small grace,
never a fixed guess: a killed invocation's lease runs out right after the invocation could
have, and the next in line is served. Waiting for the lease is bounded by the remaining time
too, keeping ``reserve`` seconds for the work itself; past that the call raises
:class:`~turnstile.AcquireTimeout` instead of timing out inside the line.

One client per store URL is kept for the life of the execution environment, so warm
invocations reuse its connections (connect outside the handler, as AWS advises). The holder
is the invocation's ``aws_request_id``: Lambda keeps it for the retries of an asynchronous
invocation, so a retry finds its own place or lease again.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from .. import Client, Lease
from .. import connect as _connect
from .._core import validate
from ..errors import AcquireTimeout, InvalidArgument, LeaseLost

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_GRACE = 5.0
DEFAULT_RESERVE = 1.0

_lock = threading.Lock()
_clients: dict[str | None, Client] = {}


class LambdaContext(Protocol):
    """What we read of the Lambda context object."""

    aws_request_id: str

    def get_remaining_time_in_millis(self) -> int: ...


def shared_client(url: str | None = None) -> Client:
    """The one client of ``url`` (default ``$TURNSTILE_URL``) in this execution environment,
    made on first use and kept across invocations."""
    with _lock:
        client = _clients.get(url)
        if client is None:
            client = _connect(url)
            _clients[url] = client
        return client


def forget_clients() -> None:
    """Close and drop the kept clients (tests; a handler never needs this)."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()


def _remaining(context: LambdaContext) -> float:
    try:
        millis = context.get_remaining_time_in_millis()
    except AttributeError:
        raise InvalidArgument(
            "context must be the Lambda context object (it has get_remaining_time_in_millis)"
        ) from None
    if isinstance(millis, bool) or not isinstance(millis, int | float) or millis < 0:
        raise InvalidArgument("context.get_remaining_time_in_millis() must be milliseconds")
    return millis / 1000.0


@contextlib.contextmanager
def lambda_lease(
    context: LambdaContext,
    name: str,
    *,
    limit: int = 1,
    url: str | None = None,
    grace: float = DEFAULT_GRACE,
    reserve: float = DEFAULT_RESERVE,
) -> Iterator[Lease]:
    """Hold ``name`` (at most ``limit`` holders) for the rest of this invocation.

    ttl = remaining time + ``grace``; the wait in line ends ``reserve`` seconds before the
    invocation's deadline (:class:`~turnstile.AcquireTimeout`). Released when the block ends.
    """
    grace = validate.seconds(grace, "grace", low=0.0, high=900.0)
    reserve = validate.seconds(reserve, "reserve", low=0.0, high=900.0)
    remaining = _remaining(context)
    ttl = max(validate.MIN_TTL, remaining + grace)
    wait = remaining - reserve
    if wait <= 0:
        raise AcquireTimeout(
            f"{name!r}: this invocation has {remaining:.3f} s left, less than reserve={reserve} s"
        )
    holder = validate.holder(getattr(context, "aws_request_id", None), "context.aws_request_id")
    sem = shared_client(url).semaphore(name, limit, ttl=ttl)
    # Not a `with` on the lease: that would renew it for as long as this process lives, and a
    # frozen sandbox's lease would then outlive its invocation by up to a whole ttl. The lease
    # ends with the invocation instead: once granted, it is cut (or stretched, for a claim) to
    # what is left of the invocation plus the grace, and never renewed after that.
    lease = sem.acquire(timeout=wait, holder=holder)
    try:
        lease.renew(max(validate.MIN_TTL, _remaining(context) + grace))
        yield lease
    finally:
        lost = lease.lost
        lease.release()
    if lost:
        raise LeaseLost(
            f"the lease on {name!r} (token {lease.token}) ran out before the block ended; "
            "its work may have overlapped with a newer holder"
        )


def sequential_handler(
    key: Callable[[Any, Any], str],
    *,
    limit: int = 1,
    url: str | None = None,
    grace: float = DEFAULT_GRACE,
    reserve: float = DEFAULT_RESERVE,
) -> Callable[[F], F]:
    """Decorate a handler ``(event, context)`` so that invocations with the same
    ``key(event, context)`` run ``limit`` at a time (1: one at a time, in arrival order)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(event: Any, context: Any) -> Any:
            name = key(event, context)
            with lambda_lease(context, name, limit=limit, url=url, grace=grace, reserve=reserve):
                return fn(event, context)

        return wrapper  # type: ignore[return-value]

    return decorate
