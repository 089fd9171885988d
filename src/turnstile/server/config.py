"""How one service instance serves (no dependencies beyond the standard library, so the
command line can describe its options without importing the web stack)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InvalidArgument
from .auth import TokenTable

DEFAULT_MAX_WAIT = 50.0  # seconds; below the 60 s an AWS Step Functions HTTP task waits
DEFAULT_MAX_BODY = 1024 * 1024  # bytes; room for a 256 KiB queue payload, JSON-escaped
DEFAULT_OBSERVE_INTERVAL = 2.0
DEFAULT_HEADER_TIMEOUT = 10.0  # seconds for a request's headers to arrive
DEFAULT_BODY_TIMEOUT = 30.0  # seconds for its body to arrive, after the headers
DEFAULT_KEEP_ALIVE = 5.0  # seconds an idle kept-alive connection stays open
DEFAULT_MAX_BODY_MEMORY = 64 * 1024 * 1024  # bytes of bodies being read at once
DEFAULT_MAX_HEADER_BYTES = 16 * 1024  # bytes of a request line and headers
DEFAULT_METRICS_NAMES = 100  # names with per-name gauges in /metrics (serve --metrics-names)
MAX_METRICS_NAMES = 10_000


@dataclass(frozen=True)
class ServerConfig:
    """How one instance serves. ``url`` names the store (default ``$TURNSTILE_URL``)."""

    url: str | None = field(default=None, repr=False)  # may hold a password: never shown
    tokens: TokenTable = field(default_factory=TokenTable)
    max_wait: float = DEFAULT_MAX_WAIT  # longest long poll (acquire ``wait``, queue get)
    max_body: int = DEFAULT_MAX_BODY  # bytes
    observe_interval: float = DEFAULT_OBSERVE_INTERVAL  # background looks; 0 = off
    observe_max_names: int = 500
    dashboard_max_names: int = 200
    event_capacity: int = 1000
    queues: tuple[str, ...] = ()  # queues to show on the dashboard and in /metrics from start
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    keep_alive: float = DEFAULT_KEEP_ALIVE
    max_connections: int | None = None  # None: half of `ulimit -n` (server/bounds.py)
    max_body_memory: int = DEFAULT_MAX_BODY_MEMORY
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    # Per-name holders/waiters gauges in /metrics: the first N held or awaited names in
    # code-point order (0: none).
    metrics_max_names: int = DEFAULT_METRICS_NAMES
    # Callback grants (server/deliveries.py). The HMAC secret signing HTTP callbacks (None:
    # $TURNSTILE_CALLBACK_SECRET, else HTTP callbacks are refused); never shown.
    callback_secret: bytes | None = field(default=None, repr=False)
    # Run a deliverer over the store for the app's lifetime (when the store delivers locally).
    deliver: bool = True
    # Hosts HTTP callback URLs may name. Empty: any host but a loopback, private, link-local
    # or otherwise non-public address (checked when asked and again when delivered).
    callback_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for arg in ("header_timeout", "body_timeout", "keep_alive"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                0.1 <= value <= 3600
            ):
                raise InvalidArgument(f"{arg} must be between 0.1 and 3600 seconds, got {value!r}")
        if self.max_connections is not None and (
            isinstance(self.max_connections, bool)
            or not isinstance(self.max_connections, int)
            or not 1 <= self.max_connections <= 1_000_000
        ):
            raise InvalidArgument(
                f"max_connections must be between 1 and 1000000, got {self.max_connections!r}"
            )
        if not self.max_body <= self.max_body_memory <= 2**40:
            raise InvalidArgument(
                f"max_body_memory must be between max_body ({self.max_body}) and 2**40 bytes, "
                f"got {self.max_body_memory}"
            )
        if not 1024 <= self.max_header_bytes <= 1024 * 1024:
            raise InvalidArgument(
                f"max_header_bytes must be between 1024 and 1048576, got {self.max_header_bytes}"
            )
        if not 1 <= self.max_wait <= 3600:
            raise InvalidArgument(
                f"max_wait must be between 1 and 3600 seconds, got {self.max_wait}"
            )
        if not 8 * 1024 <= self.max_body <= 64 * 1024 * 1024:
            raise InvalidArgument(
                f"max_body must be between 8192 and 67108864 bytes, got {self.max_body}"
            )
        if not 0 <= self.metrics_max_names <= MAX_METRICS_NAMES:
            raise InvalidArgument(
                f"metrics_max_names must be between 0 and {MAX_METRICS_NAMES}, "
                f"got {self.metrics_max_names}"
            )
        if self.callback_secret is not None and not self.callback_secret:
            raise InvalidArgument("callback_secret must not be empty")
        for host in self.callback_hosts:
            if not isinstance(host, str) or not host or any(c in host for c in "/@ \t"):
                raise InvalidArgument(
                    f"callback_hosts must be host names or addresses, got {host!r}"
                )
        if not (self.observe_interval == 0 or 0.1 <= self.observe_interval <= 3600):
            raise InvalidArgument(
                "observe_interval must be 0 (off) or 0.1 to 3600 seconds, "
                f"got {self.observe_interval}"
            )
