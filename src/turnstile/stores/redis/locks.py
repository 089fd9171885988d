"""The Redis backend's parts shared by the sync and async flavours (no I/O): the URL's options,
the key layout, the Lua scripts and the decoding of their replies.

Key layout (``docs/redis.md``): every key lives under the URL's ``prefix`` (default
``turnstile:``); the keys of one name share the hash tag ``{T}``, where ``T`` is a hash of
the name (names may hold ``{``, ``}`` and anything else, so the name itself is never part of
a key, only stored as data), so a name lives in one Redis Cluster slot::

    <prefix>{T}:d    hash  the name, limit, last fencing token, waiter sequence, and one
                           field per holder (h:<holder>) and per waiter (w:<holder>)
    <prefix>{T}:hx   zset  holders by lease expiry
    <prefix>{T}:wx   zset  waiters by waiting-entry expiry
    <prefix>{T}:wq   zset  waiters in line order
    <prefix>{T}:s:<holder>  list  wake-up signal of one waiting holder
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlunsplit

from ..._core.records import AcquireResult, Grant, HolderInfo, Status, WaiterInfo
from ..._core.urls import redact
from ...errors import ConfigurationError

DEFAULT_PREFIX = "turnstile:"
MAX_PREFIX_BYTES = 256
# Defaults when the URL does not set them: fail fast on an unreachable server.
DEFAULT_SOCKET_CONNECT_TIMEOUT = 5.0
DEFAULT_SOCKET_TIMEOUT = 10.0
# A waiter blocks at most this long in one BLPOP (then blocks again), so the blocking
# connection's socket timeout can stay bounded (a dead server is noticed).
MAX_BLOCK = 5.0

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
OPERATIONS = ("acquire", "release", "renew", "status", "probe")


@dataclass(frozen=True)
class Script:
    """One operation's Lua source and its SHA1, as EVALSHA names it."""

    text: str
    sha: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode("utf-8")).hexdigest())


def script_text(operation: str) -> str:
    """The Lua source of one operation: the shared library followed by the operation."""
    folder = resources.files("turnstile.stores.redis").joinpath("lua/lock")
    lib = folder.joinpath("_lib.lua").read_text("utf-8")
    return lib + "\n" + folder.joinpath(f"{operation}.lua").read_text("utf-8")


@dataclass(frozen=True)
class RedisConfig:
    cluster: bool
    url: str  # redis:// or rediss:// URL for redis-py (first node for a cluster), no options
    shown: str  # the URL as the user gave it, password redacted, for messages
    prefix: str
    options: dict[str, Any] = field(default_factory=dict)
    startup_nodes: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = None
    ssl: bool = False

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
    options: dict[str, Any] = {}
    ssl = scheme == "rediss"
    for key, raw in parse_qsl(parts.query, keep_blank_values=True):
        if key == "prefix":
            prefix = raw
        elif key == "ssl" and cluster:
            ssl = _parse_value(key, _BOOL, raw, shown)
        elif key in QUERY_OPTIONS:
            options[key] = _parse_value(key, QUERY_OPTIONS[key], raw, shown)
        else:
            supported = ", ".join(["prefix", *QUERY_OPTIONS, *(["ssl"] if cluster else [])])
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
            if db < 0:
                raise ValueError
        except ValueError:
            raise ConfigurationError(
                f"the path of {shown!r} must be a database number like /0"
            ) from None
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
        options=options,
        startup_nodes=tuple(nodes),
        username=username,
        password=password,
        ssl=ssl,
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


# -- keys ------------------------------------------------------------------------------------
def name_tag(name: str) -> str:
    """The hash tag of a name: 128 bits of SHA-256, hex. Braces in names never matter."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]


def key_base(prefix: str, name: str) -> str:
    return f"{prefix}{{{name_tag(name)}}}:"


KEY_SUFFIXES = ("d", "hx", "wx", "wq")


def name_keys(base: str) -> list[str]:
    return [base + suffix for suffix in KEY_SUFFIXES]


class KeyCache:
    """Key base and keys of recently used names (hashing a name is not free)."""

    SIZE = 1024

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._cache: dict[str, tuple[str, list[str]]] = {}

    def get(self, name: str) -> tuple[str, list[str]]:
        found = self._cache.get(name)
        if found is None:
            base = key_base(self.prefix, name)
            found = (base, name_keys(base))
            if len(self._cache) >= self.SIZE:
                self._cache.clear()
            self._cache[name] = found
        return found


def signal_key(base: str, holder: str) -> str:
    return f"{base}s:{holder}"


def glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def meta_pattern(prefix: str) -> str:
    """SCAN pattern matching the metadata key of every name under ``prefix``."""
    return glob_escape(prefix) + "{*}:d"


def micros(seconds: float) -> int:
    return max(1, round(seconds * 1_000_000))


# -- replies -----------------------------------------------------------------------------------
def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _seconds(us: Any) -> float:
    return int(us) / 1_000_000


def acquire_result(name: str, holder: str, reply: list[Any]) -> AcquireResult:
    granted, token, acquired, expires, now, position, retry = reply
    if int(granted) == 1:
        grant = Grant(name, holder, int(token), _seconds(acquired), _seconds(expires))
        return AcquireResult(grant, None, _seconds(now), None)
    return AcquireResult(
        None,
        None if int(position) < 0 else int(position),
        _seconds(now),
        None if int(retry) < 0 else _seconds(retry),
    )


def renew_result(name: str, holder: str, reply: list[Any]) -> Grant | None:
    if int(reply[0]) != 1:
        return None
    _, token, acquired, expires, _now = reply
    return Grant(name, holder, int(token), _seconds(acquired), _seconds(expires))


def status_result(name: str, reply: list[Any]) -> Status:
    now_us, limit, flat_holders, flat_waiters = reply
    holders = sorted(
        (
            HolderInfo(
                _text(flat_holders[i]),
                int(flat_holders[i + 1]),
                _seconds(flat_holders[i + 2]),
                _seconds(flat_holders[i + 3]),
            )
            for i in range(0, len(flat_holders), 4)
        ),
        key=lambda h: h.token,
    )
    waiters = tuple(
        WaiterInfo(
            _text(flat_waiters[i]),
            i // 3,
            _seconds(flat_waiters[i + 1]),
            _seconds(flat_waiters[i + 2]),
        )
        for i in range(0, len(flat_waiters), 3)
    )
    limit_text = _text(limit)
    return Status(
        name=name,
        limit=int(limit_text) if limit_text else None,
        holders=tuple(holders),
        waiters=waiters,
        now=_seconds(now_us),
    )


def safe_message(exc: BaseException, config: RedisConfig) -> str:
    """A driver error's text, with the password (if any) blotted out."""
    text = str(exc) or type(exc).__name__
    if config.password:
        text = text.replace(config.password, "***")
    return text
