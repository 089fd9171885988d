"""What redis-py raises, and what it means to a user (no I/O; both flavours)."""

from __future__ import annotations

from typing import Any

from redis.exceptions import (
    AuthenticationError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from ..._core.urls import scrub
from ...errors import BackendUnavailable, ConfigurationError, TurnstileError
from .config import RedisConfig

_hiredis_pack: Any = None
_HiredisSerializer: Any = None
try:  # redis[hiredis], the extra Turnstile installs; redis-py works without it
    from hiredis import pack_command as _hiredis_pack
    from redis.connection import HiredisRespSerializer as _HiredisSerializer
except ImportError:  # pragma: no cover - hiredis is part of the redis extra
    pass

# redis-py's errors (its Cluster errors are not RedisErrors) and socket errors. Each is
# translated where the backends meet the driver.
DRIVER_ERRORS = (RedisError, RedisClusterException, OSError)


def pack(conn: Any, args: tuple[Any, ...]) -> list[bytes]:
    """``conn.pack_command(*args)`` for a command of strings, integers and bytes whose name
    is one word (FCALL, EVALSHA): with hiredis, its packer straight away, the very bytes
    redis-py's hiredis serializer makes (it would first turn the name into bytes and look
    at every argument for a bytearray), for a quarter of the CPU (2.6 against 10.3 us for
    an acquire's 18 arguments). Any other packer (no hiredis, or redis.asyncio's
    connections, which pack in Python with their encoder): redis-py's."""
    packer = getattr(conn, "_command_packer", None)
    if _HiredisSerializer is not None and type(packer) is _HiredisSerializer:
        return [_hiredis_pack(args)]
    packed: list[bytes] = conn.pack_command(*args)
    return packed


def safe_message(exc: BaseException, config: RedisConfig) -> str:
    """A driver error's text, with every secret of the URL blotted out, and without a final
    full stop: it is quoted mid-sentence ("…: Connection refused; check …")."""
    text = str(exc).strip().rstrip(".") or type(exc).__name__
    return scrub(text, [*config.secrets, *([config.password] if config.password else [])])


# How a lock script refuses a name a later release keeps in another key layout (refuse_layout()
# in lua/lock/_head.lua).
LAYOUT_REFUSAL = "TURNSTILE layout "


def unavailable(config: RedisConfig, what: str, exc: BaseException) -> TurnstileError:
    """What a failed step means: the store unavailable, or (a script's refusal of a name kept
    in a newer layout) a client too old for the data, which no retry mends."""
    message = safe_message(exc, config)
    if isinstance(exc, ResponseError) and message.startswith(LAYOUT_REFUSAL):
        layout = message[len(LAYOUT_REFUSAL) :].split(":", 1)[0]
        if "earlier key layout" in message:
            return ConfigurationError(
                f"Redis {what} refused on {config.shown}: this name was written by an "
                f"earlier build of Turnstile in an earlier key layout ({layout!r}) that this "
                "release does not read (nothing was changed); its keys expire by themselves "
                "an hour after their last use, or delete the name's keys to use it at once"
            )
        return ConfigurationError(
            f"Redis {what} refused on {config.shown}: a later release of Turnstile keeps this "
            f"name in a newer key layout ({layout!r}) that this client cannot read; upgrade "
            "this client to that release (nothing was changed)"
        )
    return BackendUnavailable(f"Redis {what} failed on {config.shown}: {message}")


def connect_error(config: RedisConfig, exc: BaseException) -> TurnstileError:
    """What a driver error while connecting means, naming the problem and the fix."""
    message = safe_message(exc, config)
    if isinstance(exc, AuthenticationError) or any(
        code in message for code in ("NOAUTH", "WRONGPASS", "NOPERM", "invalid password")
    ):
        return ConfigurationError(
            f"Redis at {config.shown} refused the credentials or permissions: {message}; "
            "check the user and password in the URL"
        )
    if "not enabled" in message.lower() or "cluster support disabled" in message.lower():
        return ConfigurationError(
            f"{config.shown} is not a Redis Cluster ({message}); use redis:// instead"
        )
    if "DB index is out of range" in message or "invalid DB index" in message:
        return ConfigurationError(
            f"Redis at {config.shown} has no such database ({message}); use a database "
            "number below the server's `databases` setting (16 by default: /0 to /15)"
        )
    if isinstance(exc, ResponseError):
        return BackendUnavailable(f"Redis at {config.shown} answered: {message}")
    return BackendUnavailable(
        f"cannot reach Redis at {config.shown}: {message}; "
        "check the host and port and that the server is running"
    )
