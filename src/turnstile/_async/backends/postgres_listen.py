"""The one LISTEN connection of a PostgreSQL client, and the waiters it wakes (lock waiters
and blocked queue consumers alike): a NOTIFY payload names one waiter by its wake key
(:func:`~turnstile.stores.postgres.sql.wake_key`) and, for a lock hand-over, carries the
grant.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from typing import Any

from psycopg import AsyncConnection

from ..._core.records import Grant
from ...stores.postgres import sql as pg
from .. import _compat

log = logging.getLogger("turnstile.postgres")

# The sync LISTEN thread looks at its stop flag this often (the async task is cancelled).
LISTEN_TICK = 0.25
# A LISTEN connection that has been silent this long is checked with a round trip.
LISTEN_PING = 15.0
RECONNECT_MIN = 0.05
RECONNECT_MAX = 2.0
# Without a working LISTEN connection a waiter looks again after these pauses (doubling).
POLL_MIN = 0.005
POLL_MAX = 0.2
# How long the first waiter of a client waits for the LISTEN connection to come up.
LISTEN_START_WAIT = 2.0
# Wake-ups for a key no local waiter has registered yet are kept (a lock waiter arms after
# its first step: see AsyncListener.register), at most this many, for at most this long.
EARLY_MAX = 1024
EARLY_KEEP = 30.0
# AsyncListener.register: the waiter was armed before the step it waits on (nothing to check).
ARMED_FIRST = -1


class AsyncListener:
    """The one LISTEN connection of a client, dispatching NOTIFY payloads to local waiters.

    It listens on two channels: the client's own (:attr:`channel`, random, named by this
    client's waiting entries: lock hand-overs, with the grant in the payload) and the schema's
    (queue wake-ups, and lock waiters that joined through an older release's function).

    A lock waiter arms after its first step (``keeps_early_wakeups``), so a wake-up for it
    may arrive first: a payload for a key nobody has registered is kept (:attr:`_early`, a
    few, for a while) and delivered when that key registers. Whatever could make such a
    wake-up go unheard or be dropped before it is claimed (the connection down or
    reconnecting, an early one evicted) moves :attr:`_epoch` on; a waiter whose step was
    made at another epoch, or while the connection was not up, re-checks at once."""

    def __init__(self, config: pg.PostgresConfig) -> None:
        assert config.listen_conninfo is not None
        self._config = config
        self._conninfo = config.listen_conninfo
        self.channel = pg.client_channel(secrets.token_hex(16))
        self._registry: dict[str, list[AsyncPostgresWaiter]] = {}
        # key -> (monotonic arrival, payloads after the key) for keys nobody registered yet
        self._early: dict[str, tuple[float, list[str]]] = {}
        self._epoch = 0
        self._lock = threading.Lock()
        self._ready = _compat.Event()
        self._tried = _compat.Event()  # the first connection attempt has ended, either way
        self._stop = _compat.Event()
        self._handle: _compat.Handle | None = None
        self.connects = 0  # successful LISTENs so far (tests and diagnostics)

    @property
    def up(self) -> bool:
        """Whether a LISTEN is active right now: a hand-over NOTIFY will reach us."""
        return self._ready.is_set()

    @property
    def started(self) -> bool:
        """Whether this client listens (or is trying to): waiting entries name its channel
        only then, so a client that never blocks costs the store no NOTIFY."""
        return self._handle is not None

    def start(self) -> bool:
        """Start the listening task/thread if it is not running. True if this call did."""
        with self._lock:
            if self._handle is not None or self._stop.is_set():
                return False
            self._handle = _compat.spawn(self._run, "turnstile-postgres-listen")
            return True

    async def wait_first_attempt(self, within: float) -> bool:
        """Wait until the first connection attempt succeeded or failed; True if up."""
        await _compat.wait_event(self._tried, within)
        return self.up

    def mark(self) -> int | None:
        """Taken before a step that names this client's channel: ``register`` can then tell
        whether every wake-up sent since was heard and kept (None: not listening now)."""
        epoch = self._epoch
        return epoch if self._ready.is_set() else None

    def register(
        self, key: str, waiter: AsyncPostgresWaiter, since: int | None = ARMED_FIRST
    ) -> bool:
        """Deliver wake-ups to ``waiter`` from now on, and those kept for ``key`` that came
        before it registered. ``since``: the :meth:`mark` taken before the step the waiter
        waits on (``ARMED_FIRST``: armed before it). True if a wake-up sent since may be
        missing (not listening then, or a reconnect or eviction since): re-check."""
        with self._lock:
            self._registry.setdefault(key, []).append(waiter)
            early = self._early.pop(key, None)
            missed = since != ARMED_FIRST and (
                since is None or since != self._epoch or not self._ready.is_set()
            )
        if early is not None:
            for grant in early[1]:
                waiter.deliver(grant)
        return missed

    def unregister(self, key: str, waiter: AsyncPostgresWaiter) -> None:
        with self._lock:
            waiters = self._registry.get(key)
            if waiters is None:
                return
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            if not waiters:
                del self._registry[key]

    def _dispatch(self, payload: str) -> None:
        key, _, grant = payload.partition(" ")
        with self._lock:
            found = self._registry.get(key)
            if found is None:
                self._keep(key, grant)
                return
            waiters = list(found)
        for waiter in waiters:
            waiter.deliver(grant)

    def _keep(self, key: str, grant: str) -> None:
        """Keep a wake-up for a key nobody has registered (under the lock): the oldest kept
        ones go first when there are too many or they are too old, and moving the epoch on
        makes a waiter that stepped before it re-check (see :meth:`register`)."""
        now = time.monotonic()
        early = self._early
        kept = early.get(key)
        if kept is not None:
            if len(kept[1]) < 8:
                kept[1].append(grant)
            else:
                self._epoch += 1
            return
        while early:
            oldest = next(iter(early))
            if len(early) < EARLY_MAX and now - early[oldest][0] <= EARLY_KEEP:
                break
            del early[oldest]
            self._epoch += 1
        early[key] = (now, [grant])

    def _wake_all(self) -> None:
        with self._lock:
            waiters = [w for group in self._registry.values() for w in group]
        for waiter in waiters:
            waiter.deliver("")

    async def _run(self) -> None:
        delay = RECONNECT_MIN
        listens = [pg.listen(self.channel), pg.listen(self._config.channel)]
        complained = False
        while not self._stop.is_set():
            conn: AsyncConnection[Any] | None = None
            try:
                conn = await AsyncConnection.connect(
                    self._conninfo, autocommit=True, prepare_threshold=None
                )
                for listen in listens:
                    await conn.execute(listen)
                self.connects += 1
                with self._lock:
                    self._epoch += 1
                    self._ready.set()
                self._tried.set()
                if complained:
                    log.warning("LISTEN connection to %r is back", self._config.display)
                    complained = False
                # Hand-overs while we were not listening were not heard: everyone re-checks.
                self._wake_all()
                delay = RECONNECT_MIN
                quiet_since = time.monotonic()
                while not self._stop.is_set():
                    async for notify in conn.notifies(timeout=LISTEN_TICK):
                        self._dispatch(notify.payload)
                        quiet_since = time.monotonic()
                    if time.monotonic() - quiet_since > LISTEN_PING:
                        await conn.execute(pg.QUERIES["ping"])
                        quiet_since = time.monotonic()
            except Exception as exc:
                if not self._stop.is_set():
                    # Once per outage at warning level, then quietly until it is back.
                    log.log(
                        logging.DEBUG if complained else logging.WARNING,
                        "no LISTEN connection to PostgreSQL at %r (waiters re-check and poll "
                        "until it is back; retrying in %.2f s): %s",
                        self._config.display,
                        delay,
                        pg.describe(exc, self._config),
                    )
                    complained = True
            finally:
                self._tried.set()
                if self._ready.is_set():
                    with self._lock:
                        self._epoch += 1
                        self._ready.clear()
                    self._wake_all()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            if await _compat.wait_event(self._stop, delay):
                return
            delay = min(delay * 2, RECONNECT_MAX)

    async def close(self) -> None:
        self._stop.set()
        with self._lock:
            handle = self._handle
        if handle is not None:
            handle.cancel()  # unasync: async-only
            await _compat.join(handle)
        self._wake_all()


class AsyncPostgresWaiter:
    """Woken by the NOTIFY that hands it the grant, and keeps the grant it carried (see
    :meth:`handed`); polls with a backoff while there is no working LISTEN connection
    (``listen=off``, or the connection is down). ``since``: see :meth:`AsyncListener.register`
    (a lock waiter armed after its step)."""

    def __init__(
        self,
        listener: AsyncListener | None,
        key: str,
        name: str = "",
        holder: str = "",
        since: int | None = ARMED_FIRST,
    ) -> None:
        self._listener = listener
        self._key = key
        self._name = name
        self._holder = holder
        self._event = _compat.Event()
        self._pause = POLL_MIN
        # Grants carried by wake-ups, by the waiting entry (seq) they were made for: one made
        # for an earlier wait of the same (name, holder) must never be taken for this one.
        self._handed: dict[int, Grant] = {}
        if listener is not None and listener.register(key, self, since):
            self._event.set()  # a wake-up since the step may be missing: look again at once

    def deliver(self, grant: str) -> None:
        """Called by the listener: ``grant`` is the payload after the wake key ("seq token
        acquired_at expires_at"), or "" for a plain wake-up (re-check)."""
        if grant:
            try:
                seq, token, acquired_at, expires_at = grant.split(" ")
                self._handed[int(seq)] = Grant(
                    self._name, self._holder, int(token), float(acquired_at), float(expires_at)
                )
            except ValueError:
                log.warning("ignoring a malformed wake-up payload %r", grant)
        self._event.set()

    def handed(self, wait_id: int) -> Grant | None:
        """The grant a wake-up carried for the waiting entry ``wait_id``, if one came."""
        return self._handed.pop(wait_id, None)

    async def wait(self, timeout: float) -> bool:
        listener = self._listener
        if listener is not None and listener.up:
            self._pause = POLL_MIN
            woken = await _compat.wait_event(self._event, timeout)
        else:
            pause = min(timeout, self._pause)
            self._pause = min(self._pause * 2, POLL_MAX)
            woken = await _compat.wait_event(self._event, pause) or pause < timeout
        self._event.clear()
        return woken

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.unregister(self._key, self)
            self._listener = None
