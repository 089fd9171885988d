"""A client's one wake-up connection, and the waiters it wakes: shared by PostgreSQL (LISTEN,
``postgres_listen.py``) and Redis (SUBSCRIBE, ``redis_listen.py``). A store announces a
hand-over on the channel the waiter's client named in its step, with the grant in the
payload; the client's listener hands the payload to the local waiter it names, by wake key.

Whatever the store, a client keeps one such connection however many waiters it has, and
every waiter knows whether a wake-up for it may have gone unheard (the connection down,
reconnecting, or not yet up when its step was made), in which case it looks again at once.

No thread or task of its own reads the connection: the waiters take turns at it. One waiter
at a time reads (blocking in the read, in slices of at most ``READ_SLICE``; in a sync
client's main thread of at most ``SIGNAL_POLL``, so that a signal handler runs soon), hands
each payload to the waiter it names, and when it is done waiting offers the turn to another
waiter that is waiting. So the waiter a hand-over is for is usually the one reading, and it
holds the grant the moment the payload arrives: no second thread (or task) to wake on the
hand-over's path. Payloads that come while nobody waits stay in the connection until the
next waiter reads them, and the connection is made again, after a failure, by the next
waiter that reads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from ..._core.notes import Notes
from ..._core.records import Grant
from .. import _compat

# The longest one waiter reads the connection at a time (see _compat: the async flavour
# reads in short slices, so that a cancelled waiter stops reading soon).
READ_SLICE = _compat.LISTEN_READ_SLICE
# A listening connection that has been silent this long is checked with a round trip.
LISTEN_PING = 15.0
RECONNECT_MIN = 0.05
RECONNECT_MAX = 2.0
# Without a working listening connection a waiter looks again after these pauses (doubling).
POLL_MIN = 0.005
POLL_MAX = 0.2
# How long the first waiter of a client waits for the listening connection to come up.
LISTEN_START_WAIT = 2.0
# Wake-ups for a key no local waiter has registered yet are kept (a lock waiter arms after
# its first step: see AsyncWakeListener.register), at most this many, for at most this long.
EARLY_MAX = 1024
EARLY_KEEP = 30.0
# AsyncWakeListener.register: the waiter was armed before the step it waits on.
ARMED_FIRST = -1
# WakeMarks: notes of steps whose waiter has not armed yet, at most this many.
MARKS_MAX = 4096


class AsyncWakeListener:
    """The one listening connection of a client, dispatching payloads to local waiters.

    A lock waiter arms after its first step (``keeps_early_wakeups``), so a wake-up for it
    may arrive first: a payload for a key nobody has registered is kept (:attr:`_early`, a
    few, for a while) and delivered when that key registers. Whatever could make such a
    wake-up go unheard or be dropped before it is claimed (the connection down or
    reconnecting, an early one evicted) moves :attr:`_epoch` on; a waiter whose step was
    made at another epoch, or while the connection was not up, re-checks at once.

    A store's subclass keeps its connection in :attr:`_conn` and gives :meth:`_open`
    (connect and listen, set :attr:`_conn`, call :meth:`_listening` once it listens),
    :meth:`_read_some` (read what arrives within a timeout, passing each payload to
    :meth:`_dispatch`), :meth:`_keep_alive` (check a quiet connection), :meth:`_drop`
    (close it, calling :meth:`_down`), :meth:`close`, :meth:`_split` (a payload's wake
    key), and :meth:`_describe` (an error as the log may show it: no secret); its waiters,
    :meth:`AsyncWakeWaiter._parse`."""

    def __init__(self, display: str, log: logging.Logger) -> None:
        self._display = display  # the store as the log shows it (no secret)
        self._log = log
        self._delay = RECONNECT_MIN
        self._complained = False  # a warning was logged for the outage going on
        self._registry: dict[str, list[AsyncWakeWaiter]] = {}
        # key -> (monotonic arrival, payloads after the key) for keys nobody registered yet
        self._early: dict[str, tuple[float, list[str]]] = {}
        self._epoch = 0
        self._lock = threading.Lock()
        self._ready = _compat.Event()
        self._stop = _compat.Event()
        self._turn = threading.Lock()  # held by the waiter reading the connection
        self._conn: Any = None  # the store's listening connection (None: none now)
        self._retry_at = 0.0  # after a failure, no new connection before this
        self._quiet_since = 0.0  # (monotonic) when the connection last said something
        self.connects = 0  # successful starts of listening so far (tests and diagnostics)

    # -- what a store's subclass gives ---------------------------------------------------
    async def _open(self) -> None:
        raise NotImplementedError

    async def _read_some(self, conn: Any, timeout: float) -> bool:
        """Read what arrives on ``conn`` within ``timeout`` seconds (a reply, a batch of
        notifications: whatever must be read whole), passing each payload to
        :meth:`_dispatch`. False if nothing came; raise if the connection failed."""
        raise NotImplementedError

    async def _keep_alive(self, conn: Any) -> None:
        """``conn`` has said nothing for ``LISTEN_PING`` seconds (or since the last check):
        check that it still answers (raise if it failed)."""
        raise NotImplementedError

    async def _drop(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def _split(self, payload: str) -> tuple[str, str]:
        """A payload's wake key and the rest (the grant, or '' for a plain wake-up)."""
        key, _, grant = payload.partition(" ")
        return key, grant

    def _describe(self, exc: BaseException) -> str:
        return type(exc).__name__

    # -- the rest ----------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Whether this client has its listening connection (up, or being made)."""
        return self._conn is not None

    @property
    def up(self) -> bool:
        """Whether it listens right now: a hand-over announced now will reach us."""
        return self._ready.is_set()

    async def connect(self, within: float) -> bool:
        """Have the listening connection up: make it if nobody is (waiting at most
        ``within`` for another waiter making it). One attempt: after a failure, waiters poll
        until a later reader's attempt succeeds. True if it is up."""
        deadline = time.monotonic() + within
        while not self.up and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if await self.read(min(left, _compat.blocking_slice(READ_SLICE))):
                break  # this waiter had the turn: it made its attempt (or waits out a pause)
            await _compat.sleep(min(left, 0.01))  # another waiter reads, or is connecting
        return self.up

    async def read(self, seconds: float, until: _compat.Event | None = None) -> bool:
        """Take the turn if it is free and read for at most ``seconds`` (making the
        connection first if there is none), handing each payload to its waiter, and no
        further once ``until`` is set (the reader's own wake-up came). False if another
        waiter has the turn."""
        if not self._turn.acquire(blocking=False):
            return False
        try:
            # A read cut short (a cancelled waiter) would leave the connection mid-reply:
            # it runs to its end first, then the cancellation goes on.
            await _compat.finish_then_cancel(self._read(seconds, until))  # unasync: async-only
            # unasync: sync-only
            # self._read(seconds, until)
            # unasync: end
        finally:
            self._turn.release()
        return True

    async def _read(self, seconds: float, until: _compat.Event | None) -> None:
        """With the turn: make the connection if there is none (once the pause after a
        failure is over), else read it for at most ``seconds``; a failure drops it."""
        conn = self._conn
        try:
            if conn is None:
                if not self._stop.is_set() and time.monotonic() >= self._retry_at:
                    await self._open()  # (else: closed, or waiting out a failure)
                return
            await self._read_from(conn, time.monotonic() + seconds, until)
        except Exception as exc:
            await self._drop()
            self._failed_now(exc)

    async def _read_from(self, conn: Any, deadline: float, until: _compat.Event | None) -> None:
        """Read ``conn`` until ``deadline`` (monotonic) or until nothing comes, no further
        once ``until`` is set (the reader's own wake-up came: the rest stay for the next
        reader); then, if it has been quiet too long, check it; raise if it failed."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not await self._read_some(conn, left):
                break
            self._quiet_since = time.monotonic()
            if until is not None and until.is_set():
                break
        if time.monotonic() - self._quiet_since > LISTEN_PING:
            await self._keep_alive(conn)
            self._quiet_since = time.monotonic()  # checked: not again for LISTEN_PING

    def offer_turn(self, leaving: AsyncWakeWaiter) -> None:
        """``leaving`` stops reading: another waiter of this client that is waiting, if
        there is one, takes the turn (it may be waiting for a payload that only a reader
        will see). A waiter not in a wait now (a queue's spare) is never offered it."""
        with self._lock:
            for waiters in self._registry.values():
                for waiter in waiters:
                    if waiter is not leaving and waiter.waiting:
                        waiter.offer()
                        return

    def mark(self) -> int | None:
        """Taken before a step that names this client's channel: ``register`` can then tell
        whether every wake-up sent since was heard and kept (None: not listening now)."""
        epoch = self._epoch
        return epoch if self._ready.is_set() else None

    def register(self, key: str, waiter: AsyncWakeWaiter, since: int | None = ARMED_FIRST) -> bool:
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

    def unregister(self, key: str, waiter: AsyncWakeWaiter) -> None:
        with self._lock:
            waiters = self._registry.get(key)
            if waiters is None:
                return
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            if not waiters:
                del self._registry[key]

    def _dispatch(self, payload: str) -> None:
        key, grant = self._split(payload)
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

    def _listening(self) -> None:
        """Called by :meth:`_read` once it listens: hand-overs announced while it did not
        were not heard, so every waiter re-checks."""
        self.connects += 1
        self._quiet_since = time.monotonic()
        with self._lock:
            self._epoch += 1
            self._ready.set()
        self._delay = RECONNECT_MIN
        if self._complained:
            self._log.warning("listening connection to %s is back", self._display)
            self._complained = False
        self._wake_all()

    def _failed(self, exc: BaseException) -> None:
        """The listening connection failed (or could not be made): log it, once per outage
        at warning level, then quietly until it is back."""
        self._log.log(
            logging.DEBUG if self._complained else logging.WARNING,
            "no listening connection to %s (waiters re-check and poll until it is back; "
            "retrying in %.2f s): %s",
            self._display,
            self._delay,
            self._describe(exc),
        )
        self._complained = True

    def _failed_now(self, exc: BaseException) -> None:
        """A failure while reading or connecting (the connection is dropped meanwhile):
        logged unless closing, and no new attempt before the reconnect delay."""
        if not self._stop.is_set():
            self._failed(exc)
        self._retry_at = time.monotonic() + self._delay
        self._delay = min(self._delay * 2, RECONNECT_MAX)

    def _down(self) -> None:
        """It no longer listens: a hand-over announced from now on may go unheard, so every
        waiter re-checks (and polls until it listens again)."""
        if self._ready.is_set():
            with self._lock:
                self._epoch += 1
                self._ready.clear()
            self._wake_all()


class AsyncWakeWaiter:
    """Woken by the payload that hands it the grant, and keeps the grant it carried (see
    :meth:`handed`), reading its client's listening connection itself when its turn comes
    (see :class:`AsyncWakeListener`); polls with a backoff while there is no working
    listening connection (``listen=off`` on PostgreSQL, or the connection is down).
    ``since``: see :meth:`AsyncWakeListener.register` (a lock waiter armed after its step).
    A store's subclass reads its grants (:meth:`_parse`)."""

    log = logging.getLogger("turnstile")

    def __init__(
        self,
        listener: AsyncWakeListener | None,
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
        self._woken = False  # a wake-up (or a re-check) came, not just the turn to read
        self._offered = False  # the turn to read was offered to this waiter
        self.waiting = False  # in wait() now: the only waiters offered the turn
        # Grants carried by wake-ups, by the waiting entry (seq) they were made for: one made
        # for an earlier wait of the same (name, holder) must never be taken for this one.
        self._handed: dict[int, Grant] = {}
        if listener is not None and listener.register(key, self, since):
            self._woken = True
            self._event.set()  # a wake-up since the step may be missing: look again at once

    def _parse(self, grant: str) -> tuple[int, Grant] | None:
        """The waiting entry a payload's grant was made for, and the grant (None, or
        ValueError: not a grant)."""
        raise NotImplementedError

    def deliver(self, grant: str) -> None:
        """Called by the listener: ``grant`` is the payload after the wake key, or "" for a
        plain wake-up (re-check)."""
        if grant:
            try:
                found = self._parse(grant)
            except ValueError:
                found = None
            if found is None:
                self.log.warning("ignoring a malformed wake-up payload %r", grant[:80])
            else:
                self._handed[found[0]] = found[1]
        self._woken = True
        self._event.set()

    def offer(self) -> None:
        """The turn to read is free: take it if still waiting (not a wake-up)."""
        self._offered = True
        self._event.set()

    def handed(self, wait_id: int) -> Grant | None:
        """The grant a wake-up carried for the waiting entry ``wait_id``, if one came."""
        return self._handed.pop(wait_id, None)

    async def wait(self, timeout: float) -> bool:
        """Until woken (True: a wake-up or a re-check came) or ``timeout`` passes, reading
        the listening connection whenever the turn is free; True early, too, after a poll's
        pause while there is no listening connection."""
        listener = self._listener
        if listener is None:
            return await self._poll(timeout)
        deadline = time.monotonic() + timeout
        read = False
        self.waiting = True
        try:
            while True:
                if self._event.is_set():
                    self._event.clear()
                    if self._offered:
                        self._offered = False
                        read = True  # if it goes unused, it is offered on (finally)
                    if self._woken:
                        self._woken = False
                        return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                slice_ = _compat.blocking_slice(READ_SLICE)
                got = await listener.read(min(left, slice_), self._event)
                read = read or got
                if not listener.up:
                    # No listening connection (it failed, and is made again when its pause
                    # is over): look again with a step now and then (a few times a second),
                    # as no wake-up can be heard meanwhile.
                    return await self._poll(left)
                self._pause = POLL_MIN
                if not got:
                    # Another waiter reads: it sets our event when a payload is ours, or
                    # when it stops reading (the turn is offered to one waiting waiter).
                    await _compat.wait_event(self._event, left)
        finally:
            self.waiting = False
            if read:
                listener.offer_turn(self)

    async def _poll(self, timeout: float) -> bool:
        """Without a listening connection: a pause (doubling up to POLL_MAX), then True so
        that the caller looks again with a step (or at once when woken)."""
        pause = min(timeout, self._pause)
        self._pause = min(self._pause * 2, POLL_MAX)
        woken = await _compat.wait_event(self._event, pause) or pause < timeout
        self._event.clear()
        self._woken = False
        return woken

    async def close(self) -> None:
        listener = self._listener
        if listener is not None:
            listener.unregister(self._key, self)
            self._listener = None
            if self._offered:
                listener.offer_turn(self)  # offered, never taken: on to another waiter


class WakeMarks:
    """Notes of steps that put a holder in line, for the waiter it arms next (a lock waiter
    arms after its step, ``keeps_early_wakeups``): (name, holder) -> the listener and its
    :meth:`~AsyncWakeListener.mark` before the step, kept until that place lapses unless
    stepped again. A note outlives its place in line only until the next note is taken;
    MARKS_MAX bounds them anyway."""

    def __init__(self) -> None:
        self._marks: Notes[tuple[AsyncWakeListener, int | None]] = Notes(MARKS_MAX)

    def remember(
        self, name: str, holder: str, listener: AsyncWakeListener, mark: int | None, keep: float
    ) -> None:
        self._marks.put(name, holder, (listener, mark), keep)

    def __len__(self) -> int:
        return len(self._marks)

    def forget(self, name: str, holder: str) -> None:
        self._marks.pop(name, holder)

    def since(self, name: str, holder: str, listener: AsyncWakeListener) -> int | None:
        """What the waiter ``holder`` arms with (see :meth:`AsyncWakeListener.register`):
        the note's mark, None if it was taken with another listener, ``ARMED_FIRST``
        without a note (armed before its step, as ``Lock.wait`` and the protocol allow)."""
        note = self._marks.pop(name, holder)
        if note is None:
            return ARMED_FIRST
        return note[1] if note[0] is listener else None
