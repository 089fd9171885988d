"""The client: a backend chosen by URL, and factories for the primitives."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from .._core import urls, validate
from .._core.records import Characteristics, Status
from .._core.validate import DEFAULT_DEDUP_WINDOW
from ..errors import ConfigurationError, InvalidArgument, NotSupported
from . import _compat
from .backends.protocol import AsyncBackend, AsyncQueueBackend
from .group import AsyncSemaphoreGroup
from .queue import AsyncQueue
from .rate_limit import AsyncRateLimit
from .renewer import close_renewers
from .semaphore import AsyncLease, AsyncLock, AsyncSemaphore

F = TypeVar("F", bound=Callable[..., Any])


class AsyncClient:
    """A connection to one store. Cheap to share; close it when done."""

    def __init__(self, backend: AsyncBackend, url: str) -> None:
        self.backend = backend
        self.url = urls.redact(url)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    @property
    def characteristics(self) -> Characteristics:
        return self.backend.characteristics

    def lock(
        self,
        name: str,
        ttl: float = 30.0,
        *,
        on_lost: Callable[[AsyncLease], object] | None = None,
        timeout: float | None = None,
        priority: int = 0,
        ageing: float | bool | None = None,
    ) -> AsyncLock:
        """A fair leased lock: one holder of ``name`` at a time, in arrival order.

        ``async with client.lock(name) as lease:`` waits up to ``timeout`` seconds (``None``:
        without a limit) and keeps the lease renewed until the block ends; ``acquire``,
        ``try_acquire`` and the rest give finer control. ``priority`` (-1000 to 1000,
        larger first, FIFO within a level) and ``ageing`` (``None``: strict; ``True``: one
        level per 10 s waited; or seconds per level) place waiters (docs/admission.md)."""
        return AsyncLock(
            self.backend,
            name,
            ttl,
            on_lost=on_lost,
            timeout=timeout,
            priority=priority,
            ageing=ageing,
        )

    def semaphore(
        self,
        name: str,
        limit: int,
        ttl: float = 30.0,
        *,
        on_lost: Callable[[AsyncLease], object] | None = None,
        timeout: float | None = None,
        priority: int = 0,
        ageing: float | bool | None = None,
        rate: int | None = None,
        per: float = 1.0,
        burst: int = 1,
    ) -> AsyncSemaphore:
        """A fair leased semaphore: at most ``limit`` holders of ``name``, in arrival order.

        ``async with client.semaphore(name, limit) as lease:`` waits up to ``timeout``
        seconds (``None``: without a limit), like :meth:`lock`, with the same ``priority``
        and ``ageing``. With ``rate`` (and ``per``, ``burst``), at most ``rate + burst``
        holders *start* in any window of ``per`` seconds too: a granted caller keeps its slot
        until the rate admits it (docs/admission.md)."""
        return AsyncSemaphore(
            self.backend,
            name,
            limit,
            ttl,
            on_lost=on_lost,
            timeout=timeout,
            priority=priority,
            ageing=ageing,
            rate=rate,
            per=per,
            burst=burst,
        )

    def semaphore_group(
        self,
        name: str,
        per_key: int,
        total: int,
        ttl: float = 30.0,
        *,
        on_lost: Callable[[AsyncLease], object] | None = None,
        timeout: float | None = None,
        priority: int = 0,
        ageing: float | bool | None = None,
    ) -> AsyncSemaphoreGroup:
        """Per-key limits under a total cap: at most ``per_key`` holders per key and at most
        ``total`` in all, in one line where a busy key never holds up the others
        (``async with group.acquire(key) as lease:``; docs/admission.md)."""
        return AsyncSemaphoreGroup(
            self.backend,
            name,
            per_key,
            total,
            ttl,
            on_lost=on_lost,
            timeout=timeout,
            priority=priority,
            ageing=ageing,
        )

    def rate_limit(
        self,
        name: str,
        rate: int,
        per: float = 1.0,
        burst: int = 1,
        *,
        timeout: float | None = None,
        priority: int = 0,
        ageing: float | bool | None = None,
    ) -> AsyncRateLimit:
        """A rate limit whose callers wait in line: at most ``burst`` at once from idle, at
        most ``rate + burst`` in any window of ``per`` seconds (store clock), admitted in
        arrival order (by ``priority`` first, as :meth:`lock`), each woken at its slot
        (docs/admission.md)."""
        return AsyncRateLimit(
            self.backend,
            name,
            rate,
            per,
            burst,
            timeout=timeout,
            priority=priority,
            ageing=ageing,
        )

    def queue(
        self,
        name: str,
        visibility_timeout: float = 30.0,
        max_attempts: int = 5,
        concurrency: int | None = None,
        *,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
    ) -> AsyncQueue:
        """A durable keyed FIFO queue: one message per key in flight, in put order; many
        keys in parallel; at most ``concurrency`` in flight in all (``None``: no cap).
        Raises :class:`~turnstile.NotSupported` on a backend without queues."""
        return AsyncQueue(
            self._queues(),
            name,
            visibility_timeout,
            max_attempts,
            concurrency,
            dedup_window=dedup_window,
            long_poll_gets=self.backend.characteristics.long_poll_gets,
        )

    def _queues(self) -> AsyncQueueBackend:
        if not self.backend.characteristics.queues:
            raise NotSupported(
                f"the {self.backend.characteristics.scheme}:// backend does not support "
                "queues in this release"
            )
        return self.backend.queues()

    async def queue_names(self, prefix: str = "", max_count: int = 1000) -> list[str]:
        """Queues that hold messages (ready, delayed, in flight or dead) whose names start
        with ``prefix`` (literally): the first ``max_count`` in code-point order. A queue
        whose every message was acked is not listed (it has nothing to show)."""
        validate.max_count(max_count)
        possible = validate.prefix(prefix)
        queues = self._queues()
        return await queues.names(prefix, max_count) if possible else []

    async def status(self, name: str) -> Status:
        return await self.backend.status(validate.name(name))

    async def names(self, prefix: str = "", max_count: int = 1000) -> list[str]:
        """Names that have holders or waiters right now and start with ``prefix``
        (literally): the first ``max_count`` in code-point order."""
        validate.max_count(max_count)
        if not validate.prefix(prefix):
            return []  # no name can start with it
        return await self.backend.names(prefix, max_count)

    def sequential(
        self,
        key: Callable[..., Any] | str,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        prefix: str | None = None,
    ) -> Callable[[F], F]:
        """Run the decorated function one call at a time per key, in arrival order.

        ``key`` is a callable taking the function's arguments, or the name of one of its
        parameters. The lock name is ``prefix + str(key)``; ``prefix`` defaults to the
        function's qualified name and ``":"``, so pass e.g. ``prefix="order:"`` to share the
        lock with other functions."""
        validate.ttl(ttl)
        validate.timeout(timeout)
        if not (callable(key) or isinstance(key, str)):
            raise InvalidArgument("key must be a callable or the name of a parameter")

        def decorate(fn: F) -> F:
            self._check_function(fn, "sequential")
            getter = _key_getter(fn, key)
            base = prefix if prefix is not None else f"{fn.__module__}.{fn.__qualname__}:"

            @functools.wraps(fn)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                name = base + str(getter(args, kwargs))
                lease = await self.lock(name, ttl).acquire(timeout=timeout)
                async with lease:
                    return await fn(*args, **kwargs)

            return wrapper  # type: ignore[return-value]

        return decorate

    def limited(
        self, name: str, limit: int, *, ttl: float = 30.0, timeout: float | None = None
    ) -> Callable[[F], F]:
        """Run the decorated function at most ``limit`` calls at a time, across processes."""
        sem = self.semaphore(name, limit, ttl)
        validate.timeout(timeout)

        def decorate(fn: F) -> F:
            self._check_function(fn, "limited")

            @functools.wraps(fn)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                lease = await sem.acquire(timeout=timeout)
                async with lease:
                    return await fn(*args, **kwargs)

            return wrapper  # type: ignore[return-value]

        return decorate

    @staticmethod
    def _check_function(fn: Any, decorator: str) -> None:
        if not _compat.is_flavour_function(fn):
            other = "turnstile.connect" if _compat.FLAVOUR == "async" else "turnstile.aio.connect"
            kind = "a plain function" if _compat.FLAVOUR == "async" else "a coroutine function"
            raise InvalidArgument(
                f"@{decorator} of a {_compat.FLAVOUR} client cannot wrap {kind} "
                f"({getattr(fn, '__qualname__', fn)!r}); use a client from {other}()"
            )

    async def ping(self) -> None:
        await self.backend.ping()

    async def close(self) -> None:
        await close_renewers(self.backend)
        await self.backend.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _key_getter(
    fn: Any, key: Callable[..., Any] | str
) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    if callable(key):
        return lambda args, kwargs: key(*args, **kwargs)
    signature = inspect.signature(fn)
    if key not in signature.parameters:
        raise InvalidArgument(f"key={key!r} is not a parameter of {fn.__qualname__}{signature}")

    def get(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments[key]

    return get


async def connect(url: str | None = None, **options: Any) -> AsyncClient:
    """Open a client for ``url`` (default: ``$TURNSTILE_URL``, else one SQLite file per
    user and host, ``$XDG_STATE_HOME/turnstile/turnstile.db``; an empty URL is refused).
    Fails at once, naming the fix, on an unknown scheme, a missing optional driver or an
    unreachable server."""
    url = urls.resolve_url(url)
    entry, parts = urls.split(url)
    try:
        module = importlib.import_module(f"{__package__}.backends.{entry.module}")
    except ImportError as exc:
        if exc.name and exc.name.startswith("turnstile"):
            raise ConfigurationError(
                f"the {entry.description} backend is not available in this release"
            ) from None
        raise urls.missing_driver(entry, exc) from None
    try:
        if options:
            backend = await module.open_backend(url, parts, **options)
        else:
            backend = await module.open_backend(url, parts)
    except Exception as exc:
        # The driver's error, chained below ours, may quote the URL's secrets.
        urls.scrub_exception(exc, urls.secrets_in(url))
        raise
    client = AsyncClient(backend, url)
    return client
