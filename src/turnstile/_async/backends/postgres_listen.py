"""The one LISTEN connection of a PostgreSQL client, and the waiters it wakes (lock waiters
and blocked queue consumers alike): a NOTIFY payload names one waiter by its wake key
(:func:`~turnstile.stores.postgres.sql.wake_key`) and, for a lock hand-over, carries the
grant. What every store's listener does (waiters, early wake-ups, epochs, reconnecting) is
in ``wakeups.py``.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from typing import Any

from psycopg import AsyncConnection

from ..._core.records import Grant
from ...stores.postgres import sql as pg
from .wakeups import (
    ARMED_FIRST,
    EARLY_MAX,
    LISTEN_PING,
    LISTEN_START_WAIT,
    LISTEN_TICK,
    POLL_MAX,
    AsyncWakeListener,
    AsyncWakeWaiter,
)

__all__ = [
    "ARMED_FIRST",
    "EARLY_MAX",
    "LISTEN_START_WAIT",
    "POLL_MAX",
    "AsyncListener",
    "AsyncPostgresWaiter",
]

log = logging.getLogger("turnstile.postgres")


class AsyncListener(AsyncWakeListener):
    """The one LISTEN connection of a client, dispatching NOTIFY payloads to local waiters.

    It listens on two channels: the client's own (:attr:`channel`, random, named by this
    client's waiting entries: lock hand-overs, with the grant in the payload) and the schema's
    (queue wake-ups, and lock waiters that joined through an older release's function)."""

    thread_name = "turnstile-postgres-listen"

    def __init__(self, config: pg.PostgresConfig) -> None:
        assert config.listen_conninfo is not None
        super().__init__(f"PostgreSQL at {config.display!r}", log)
        self._config = config
        self._conninfo = config.listen_conninfo
        self.channel = pg.client_channel(secrets.token_hex(16))

    def _describe(self, exc: BaseException) -> str:
        return pg.describe(exc, self._config)

    async def _session(self) -> None:
        conn: AsyncConnection[Any] | None = None
        try:
            conn = await AsyncConnection.connect(
                self._conninfo, autocommit=True, prepare_threshold=None
            )
            for listen in (pg.listen(self.channel), pg.listen(self._config.channel)):
                await conn.execute(listen)
            self._listening()
            quiet_since = time.monotonic()
            while not self._stop.is_set():
                async for notify in conn.notifies(timeout=LISTEN_TICK):
                    self._dispatch(notify.payload)
                    quiet_since = time.monotonic()
                if time.monotonic() - quiet_since > LISTEN_PING:
                    await conn.execute(pg.QUERIES["ping"])
                    quiet_since = time.monotonic()
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()


class AsyncPostgresWaiter(AsyncWakeWaiter):
    """A lock waiter or blocked queue consumer of a PostgreSQL client."""

    log = log

    def _parse(self, grant: str) -> tuple[int, Grant] | None:
        """``seq token acquired_at expires_at`` (times in epoch seconds)."""
        seq, token, acquired_at, expires_at = grant.split(" ")
        return int(seq), Grant(
            self._name, self._holder, int(token), float(acquired_at), float(expires_at)
        )
