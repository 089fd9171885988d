"""Callback grants in the service: which callbacks a request may ask for, the deliverer the
service runs over its store, and what ``/metrics`` and ``/v1/deliveries`` show of it.

A try-acquire may carry ``callback`` (``{"kind": "sfn", "task_token": …}`` or
``{"kind": "http", "url": …}``, ``_core/callbacks.py``). The service delivers the grants
itself (:class:`~turnstile.workflows.deliverer.Deliverer`, started with the app, nudged after
every request that may grant a callback waiter), unless ``--no-deliver``.

HTTP callbacks make the service send POSTs to addresses its callers choose, so they are
fenced (server-side request forgery):

* they need the service's callback secret (every POST is signed with it): without one they
  are refused when asked for;
* with ``--callback-hosts`` the URL's host must be one of those (``.example.com`` also
  admits its subdomains); the hosts listed are trusted, whatever they resolve to;
* without it, any host but the ones that are not public: a loopback, private, link-local,
  shared, reserved or multicast address literal, or ``localhost``, is refused when asked
  for, and a name that resolves to such an address is refused when delivered (the grant is
  released and the next in line served);
* redirects are never followed (a 3xx is a refusal).

The same fence is applied when asked for (``invalid_argument``, 422, naming
``callback.url``) and again when delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from .._core import callbacks
from .._core.records import CallbackDelivery
from ..errors import InvalidArgument
from ..workflows import deliverer as delivering
from ..workflows.deliverer import DeliveryStats, Outcome
from .metrics import Histogram

log = logging.getLogger("turnstile.server")

# grant -> delivered, seconds: deliveries are milliseconds when the receiver is up, minutes
# while it is retried.
DELIVERY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
)  # fmt: skip
# How often the store's count of pending deliveries is sampled (one query, whatever the
# scrape rate).
PENDING_SAMPLE = 1.0
OUTCOMES = ("delivered", "refused", "retried", "lost")


def _norm(host: str) -> str:
    host = host.strip().lower().strip("[]").rstrip(".")
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    return host


def allowed_host(host: str, allow: tuple[str, ...]) -> bool:
    """Whether ``host`` is one of ``allow`` (an entry starting with ``.`` or ``*.`` admits
    that domain and its subdomains)."""
    host = _norm(host)
    for entry in allow:
        wanted = entry.strip().lower()
        if wanted.startswith("*."):
            wanted = wanted[1:]
        if wanted.startswith("."):
            domain = wanted.rstrip(".")
            if host == domain[1:] or host.endswith(domain):
                return True
        elif host == _norm(wanted):
            return True
    return False


def public_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


def refusal(url: str, allow: tuple[str, ...]) -> str | None:
    """Why the fence refuses an HTTP callback to ``url`` without resolving it, or None."""
    host = urlsplit(url).hostname or ""
    if allow:
        if allowed_host(host, allow):
            return None
        return f"host {host!r} is not one of this service's callback hosts (--callback-hosts)"
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost") or (
        _literal(host) and not public_address(host)
    ):
        return (
            f"host {host!r} is not a public address; the service sends callbacks only to "
            "public hosts unless it lists the host in --callback-hosts"
        )
    return None


def check_callback(
    fields: Any, *, secret: bytes | None, allow: tuple[str, ...]
) -> callbacks.Callback:
    """The ``callback`` field of a request, checked: its form (``callbacks.from_fields``),
    then the service's fence for HTTP callbacks. Raises InvalidArgument naming the field."""
    callback = callbacks.from_fields(fields, "callback")
    if isinstance(callback, callbacks.HttpCallback):
        if secret is None:
            raise InvalidArgument(
                "callback.url: this service has no callback secret to sign HTTP callbacks "
                f"with (${delivering.SECRET_ENV} or --callback-secret-file); it accepts "
                "Step Functions callbacks only"
            )
        why = refusal(callback.url, allow)
        if why is not None:
            raise InvalidArgument(f"callback.url: {why}")
    return callback


def _resolves_publicly(host: str) -> str | None:
    """None if every address of ``host`` is public, else why not."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise _Unresolved(f"cannot resolve the callback host: {type(exc).__name__}") from None
    for info in infos:
        address = str(info[4][0])
        if not public_address(address):
            return "the callback host resolves to an address that is not public"
    return None


class _Unresolved(Exception):
    pass


def sender(secret: bytes | None, allow: tuple[str, ...]) -> delivering.Sender:
    """The service's way to send a delivery: Step Functions as every deliverer does; HTTP
    through the fence, signed, with no redirects."""

    def send(delivery: CallbackDelivery, callback: callbacks.Callback, body: bytes) -> Outcome:
        if isinstance(callback, callbacks.StepFunctionsCallback):
            return delivering.send_sfn(delivery, callback.task_token, body)
        why = refusal(callback.url, allow)
        if why is None and not allow:
            host = urlsplit(callback.url).hostname or ""
            try:
                why = _resolves_publicly(host)
            except _Unresolved as exc:
                return Outcome(delivering.RETRY, str(exc))
        if why is not None:
            return Outcome(delivering.REFUSED, why)
        return delivering.send_http(callback.url, body, secret)

    return send


class Deliveries:
    """What the service shows of callback deliveries: the store's pending count, sampled at
    most every :data:`PENDING_SAMPLE` seconds, and its own deliverer's outcomes (counters
    and a grant-to-delivered histogram fed from ``Deliverer.stats``)."""

    def __init__(self) -> None:
        self.deliverer: delivering.Deliverer | None = None
        self.latency = Histogram(DELIVERY_BUCKETS)
        self._seen = 0  # deliveries of stats.delivered already in the histogram
        self._pending: int | None = None
        self._sampled = -float("inf")
        self._lock = asyncio.Lock()

    @property
    def stats(self) -> DeliveryStats:
        return self.deliverer.stats if self.deliverer is not None else DeliveryStats()

    def nudge(self) -> None:
        if self.deliverer is not None:
            self.deliverer.nudge()

    def sync(self) -> None:
        """Feed the latencies of deliveries made since the last call to the histogram."""
        stats = self.stats
        new = stats.delivered - self._seen
        if new <= 0:
            return
        for seconds in stats.latencies[-new:] if new <= len(stats.latencies) else ():
            self.latency.observe(seconds)
        self._seen = stats.delivered

    async def pending(self, fetch: Any) -> int | None:
        """The store's pending deliveries (``fetch()``), at most one query per sample
        period however many ask; None if the store cannot say."""
        if time.monotonic() - self._sampled < PENDING_SAMPLE:
            return self._pending
        async with self._lock:
            if time.monotonic() - self._sampled >= PENDING_SAMPLE:
                try:
                    self._pending = int(await fetch())
                except Exception as exc:  # the store may be away; show the last sample
                    log.debug("cannot count pending deliveries: %s", exc)
                self._sampled = time.monotonic()
        return self._pending

    def to_dict(self) -> dict[str, Any]:
        self.sync()
        stats = self.stats.as_dict()
        return {
            "running": self.deliverer is not None and self.deliverer.running,
            **{k: stats[k] for k in OUTCOMES},
            "latency_p50": stats["latency_p50"],
            "latency_p99": stats["latency_p99"],
        }
