"""The options of a ``redis://``, ``rediss://`` or ``redis+cluster://`` URL (no I/O), shared
by the sync and async flavours: Turnstile's own (``prefix``, ``functions``) split off from
redis-py's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlunsplit

from ..._core.urls import redact, secrets_in
from ...errors import ConfigurationError

DEFAULT_PREFIX = "turnstile:"
MAX_PREFIX_BYTES = 256
# Defaults when the URL does not set them: fail fast on an unreachable server.
DEFAULT_SOCKET_CONNECT_TIMEOUT = 5.0
DEFAULT_SOCKET_TIMEOUT = 10.0
# A blocked queue consumer blocks at most this long in one BLPOP (then blocks again), so the
# blocking connection's socket timeout can stay bounded (a dead server is noticed); the lock
# waiters' subscriber connection reads with the same bound.
MAX_BLOCK = 5.0
# Redis keeps its database count in a signed int (`databases`): no index can be larger.
MAX_DB = 2**31 - 2

# Query parameters passed on to redis-py, with their parsers.
_FLOAT = "float"
_INT = "int"
_BOOL = "bool"
_STR = "str"
QUERY_OPTIONS: dict[str, str] = {
    "socket_timeout": _FLOAT,
    "socket_connect_timeout": _FLOAT,
    "socket_keepalive": _BOOL,
    "health_check_interval": _FLOAT,
    "max_connections": _INT,
    "client_name": _STR,
    "ssl_cert_reqs": _STR,
    "ssl_ca_certs": _STR,
    "ssl_certfile": _STR,
    "ssl_keyfile": _STR,
    "ssl_check_hostname": _BOOL,
}


@dataclass(frozen=True)
class RedisConfig:
    cluster: bool
    # redis:// or rediss:// URL for redis-py (first node for a cluster), no options; it may
    # hold the password, so it is never shown
    url: str = field(repr=False)
    shown: str  # the URL as the user gave it, password redacted, for messages
    prefix: str
    options: dict[str, Any] = field(default_factory=dict)
    # Run the steps (locks, queues, rate limits) as Redis 7 function libraries (FUNCTION
    # LOAD / FCALL) where the server can; False (functions=off): always as scripts
    # (EVALSHA). See docs/redis.md.
    functions: bool = True
    startup_nodes: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never shown
    ssl: bool = False
    secrets: tuple[str, ...] = field(default=(), repr=False)  # every form, to scrub

    def blocking_options(self) -> dict[str, Any]:
        """Options for the connection(s) that block in BLPOP: their socket timeout must
        outlast the longest block."""
        options = dict(self.options)
        options["socket_timeout"] = MAX_BLOCK + float(
            self.options.get("socket_timeout") or DEFAULT_SOCKET_TIMEOUT
        )
        return options


def _parse_value(key: str, kind: str, raw: str, shown: str) -> Any:
    try:
        if kind == _FLOAT:
            value = float(raw)
            if not math.isfinite(value) or value <= 0:
                raise ValueError
            return value
        if kind == _INT:
            number = int(raw)
            if number < 1:
                raise ValueError
            return number
        if kind == _BOOL:
            lowered = raw.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
    except ValueError:
        accepted = {
            _FLOAT: "a positive number of seconds",
            _INT: "a positive integer",
            _BOOL: "true or false",
        }[kind]
        raise ConfigurationError(
            f"URL option {key}={raw!r} in {shown!r} is invalid: expected {accepted}"
        ) from None
    return raw


def parse_url(url: str, parts: SplitResult) -> RedisConfig:
    """Check a ``redis://``, ``rediss://`` or ``redis+cluster://`` URL and split off our
    options (``prefix``) from redis-py's (socket timeouts, TLS files, ...)."""
    shown = redact(url)
    scheme = parts.scheme.lower()
    cluster = scheme == "redis+cluster"
    prefix = DEFAULT_PREFIX
    functions = True
    options: dict[str, Any] = {}
    ssl = scheme == "rediss"
    for key, raw in parse_qsl(parts.query, keep_blank_values=True):
        if key == "prefix":
            prefix = raw
        elif key == "functions":
            functions = _parse_value(key, _BOOL, raw, shown)
        elif key == "ssl" and cluster:
            ssl = _parse_value(key, _BOOL, raw, shown)
        elif key in QUERY_OPTIONS:
            options[key] = _parse_value(key, QUERY_OPTIONS[key], raw, shown)
        else:
            ours = ["prefix", "functions", *(["ssl"] if cluster else [])]
            supported = ", ".join([*ours, *QUERY_OPTIONS])
            raise ConfigurationError(
                f"unknown option {key!r} in Redis URL {shown!r}; supported: {supported}"
            )
    if not prefix:
        raise ConfigurationError(f"prefix must not be empty in {shown!r}")
    if "{" in prefix or "}" in prefix:
        raise ConfigurationError(
            f"prefix {prefix!r} in {shown!r} must not contain '{{' or '}}': Turnstile puts its "
            "own hash tag after the prefix so that each name lives in one Cluster slot"
        )
    if len(prefix.encode("utf-8")) > MAX_PREFIX_BYTES:
        raise ConfigurationError(f"prefix in {shown!r} is longer than {MAX_PREFIX_BYTES} bytes")
    options.setdefault("socket_connect_timeout", DEFAULT_SOCKET_CONNECT_TIMEOUT)
    options.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)

    netloc = parts.netloc
    userinfo, _, hosts = netloc.rpartition("@")
    username = unquote(userinfo.partition(":")[0]) or None if userinfo else None
    password = unquote(userinfo.partition(":")[2]) if ":" in userinfo else None
    nodes: list[tuple[str, int]] = []
    for item in (hosts or "").split(","):
        if not item:
            continue
        host, port = _host_port(item, shown)
        nodes.append((host, port))
    if not nodes:
        nodes = [("localhost", 6379)]
    if not cluster and len(nodes) > 1:
        raise ConfigurationError(
            f"{shown!r} names several hosts; use redis+cluster:// for a Redis Cluster "
            "(Sentinel: point redis:// at the current primary or a proxy)"
        )
    path = parts.path or ""
    if cluster and path.strip("/") not in ("", "0"):
        raise ConfigurationError(f"a Redis Cluster has only database 0, not {path!r} ({shown!r})")
    if not cluster and path.strip("/"):
        try:
            db = int(path.strip("/"))
        except ValueError:
            raise ConfigurationError(
                f"the path of {shown!r} must be a database number like /0"
            ) from None
        if not 0 <= db <= MAX_DB:
            raise ConfigurationError(
                f"Redis database index {db} in {shown!r} is out of range: it must be 0 to "
                f"the server's `databases` setting minus 1 (0 to 15 by default)"
            )
    first_host, first_port = nodes[0]
    host_text = f"[{first_host}]" if ":" in first_host else first_host
    base_netloc = f"{host_text}:{first_port}"
    if userinfo:
        base_netloc = f"{userinfo}@{base_netloc}"
    plain = urlunsplit(("rediss" if ssl else "redis", base_netloc, "" if cluster else path, "", ""))
    return RedisConfig(
        cluster=cluster,
        url=plain,
        shown=shown,
        prefix=prefix,
        functions=functions,
        options=options,
        startup_nodes=tuple(nodes),
        username=username,
        password=password,
        ssl=ssl,
        secrets=tuple(secrets_in(url)),
    )


def _host_port(item: str, shown: str) -> tuple[str, int]:
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif item.count(":") == 1:
        host, _, port_text = item.partition(":")
    else:
        host, port_text = item, ""
    try:
        port = int(port_text) if port_text else 6379
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        raise ConfigurationError(f"bad port in Redis URL {shown!r}") from None
    return host or "localhost", port
