"""Every lock and queue under test, each peer library once, plus the store counters.

An adapter is built once in each worker process (by its contender's factory) and used
sequentially; peer libraries are imported inside the constructors, so a module that is not
installed only matters to the script that asks for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

TTL = 30.0  # every Redis peer's lock expiry, so none of them expires mid-run
# How many times a worker runs its lock's paths before the start line (LockAdapter.warm_up):
# a worker that has been running has done so many times. On PostgreSQL a server connection
# compiles a function at its first call and plans each statement at its first run (psycopg
# prepares a peer's statement at its fifth), and a client may use more than one connection.
WARM_UP_ROUNDS = 3


# -- the interface -----------------------------------------------------------------------------
class LockAdapter:
    """One worker process's handle on one lock implementation.

    Built once per worker process (by the contender's factory), then used sequentially: each
    :meth:`acquire` (block until ``name`` is held) is followed by one :meth:`release`. A worker
    holds at most one lock at a time, so an adapter may keep the held lock in an attribute.

    ``queued_at``: after an :meth:`acquire` that had to wait, the monotonic time at which the
    lock *confirmed* that the request was in line (NaN if it was granted at once, or if the
    lock never says so, like a blocking ``pg_advisory_lock`` or ``redis.lock.Lock``). It makes
    the certain FIFO check possible (:func:`metrics.certain_fifo_violations`).
    """

    queued_at: float = math.nan

    def acquire(self, name: str) -> None:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def warm_up(self, name: str) -> None:
        """Called once on a private ``name`` before the start line: leave the adapter as a
        worker that has been running for a while leaves it (connections open, scripts
        loaded, statements planned, files created). By default :meth:`acquire` and
        :meth:`release`, ``WARM_UP_ROUNDS`` times."""
        for _ in range(WARM_UP_ROUNDS):
            self.acquire(name)
            self.release()

    def close(self) -> None:
        """Called once when the worker is done (close connections)."""


Probe = Callable[[], Mapping[str, float]]

#: The probe key of the store's own CPU time in seconds (the server's processes, user and
#: system), where the probe can read it: the uncontended tables report it per operation, the
#: per-grant tables leave it out.
SERVER_CPU = "server CPU s"


@dataclass(frozen=True)
class Contender:
    """A lock implementation under test.

    ``factory`` runs in every worker process and must be picklable. ``probe`` (optional) runs
    in the parent and returns counters of the store (e.g. Redis commands processed,
    PostgreSQL transactions committed); it is read right before the workers start and right
    after they finish, and the differences are reported per grant.
    """

    label: str
    factory: Callable[[], LockAdapter]
    note: str = ""
    probe: Probe | None = None


class _NeverIdle(dict):  # type: ignore[type-arg]
    """A PostgreSQL backend's ``_known`` whose names are never taken for idle."""

    def get(self, key: object, default: object = None) -> Any:
        return 0 if key in self else None  # a name it knows never has a streak of fast grants


class TurnstileLock(LockAdapter):
    """Turnstile's lock on any URL, used the way the SPEC shows it: ``with lock.acquire():``
    (the lease auto-renews in the background while held). ``renew=False`` uses a bare
    ``acquire()`` / ``release()`` without the renewing context manager."""

    def __init__(
        self, url: str, ttl: float = 30.0, renew: bool = True, idle_hint: bool = True
    ) -> None:
        import turnstile

        self._client = turnstile.connect(url)
        if not idle_hint:
            # PostgreSQL, for an A/B in one run: the client's per-name hint never says
            # "idle", so every acquire of a known name sends acquire_fast (the UPDATE with
            # the function behind it) instead of acquire_idle (the bare UPDATE).
            self._client.backend._known = _NeverIdle()
        self._ttl = ttl
        self._renew = renew
        self._lease: Any = None
        # queued_at: the moment the store first answered an acquire's step with a place in
        # line (a step that neither granted nor refused), read by wrapping the backend's step
        # on this client only. Turnstile also logs that moment at DEBUG, but a logger at DEBUG
        # makes a record at every acquire and hand-over, which an application logging at
        # INFO never pays (about 0.05 ms of each PostgreSQL hand-over of the demo's webhooks
        # in a scratch trace).
        backend = self._client.backend
        step = backend.acquire

        def acquire_step(*args: Any, **kwargs: Any) -> Any:
            result = step(*args, **kwargs)
            if result.grant is None and result.position is not None and math.isnan(
                self.queued_at
            ):
                self.queued_at = time.monotonic()
            return result

        backend.acquire = acquire_step

    def warm_up(self, name: str) -> None:
        """``WARM_UP_ROUNDS`` rounds, each on a name of its own (the first acquire of a name
        the client has not seen, then of one it has): an acquire and release, then two
        hand-overs, one waited for by a second thread and one by this thread. A Turnstile
        client opens its wake-up channel (the Redis subscriber connection, the PostgreSQL
        LISTEN connection) on its first wait, and on PostgreSQL each of its pooled
        connections compiles the functions of a busy name's steps (joining the line, the
        release that grants) at their first call there: a worker that has been running has
        done both, as the peers' single connection is warm after their warm-up."""
        for round_ in range(WARM_UP_ROUNDS):
            warm = f"{name}-{round_}"
            self._client.lock(warm, ttl=self._ttl).acquire().release()
            self._hand_over(warm, wait_here=False)
            self._hand_over(warm, wait_here=True)

    def _hand_over(self, name: str, wait_here: bool) -> None:
        """One hand-over of ``name`` between this thread and a second one: the waiter asks
        while the other holds, and is handed it on release."""
        held: list[Any] = []
        done: list[Any] = []

        def hold() -> None:
            held.append(self._client.lock(name, ttl=self._ttl).acquire())

        def wait() -> None:
            self._client.lock(name, ttl=self._ttl).acquire(timeout=30).release()
            done.append(True)

        if wait_here:
            holder = threading.Thread(target=hold, daemon=True)
            holder.start()
            holder.join(30)
            releaser = threading.Thread(target=self._release_once_waited, args=(name, held))
            releaser.start()
            wait()
            releaser.join(30)
        else:
            hold()
            waiter = threading.Thread(target=wait, daemon=True)
            waiter.start()
            self._release_once_waited(name, held)
            waiter.join(30)
        if not done:
            raise RuntimeError(f"warm-up: the waiter on {name!r} was not handed the lock")

    def _release_once_waited(self, name: str, held: list[Any]) -> None:
        """Release the lease in ``held`` once ``name`` has a waiter (at most 30 s on)."""
        lock = self._client.lock(name, ttl=self._ttl)
        deadline = time.monotonic() + 30
        while not lock.status().waiters and time.monotonic() < deadline:
            time.sleep(0.005)
        held[0].release()

    def acquire(self, name: str) -> None:
        self.queued_at = math.nan
        lease = self._client.lock(name, ttl=self._ttl).acquire()
        if self._renew:
            lease.__enter__()
        self._lease = lease

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if self._renew:
            lease.__exit__(None, None, None)
        else:
            lease.release()

    def close(self) -> None:
        self._client.close()


# -- files -------------------------------------------------------------------------------------
class FileLockAdapter(LockAdapter):
    """`filelock.FileLock`, one lock file per name, default settings (it polls the file's
    `flock` every 50 ms while blocked)."""

    def __init__(self, folder: str) -> None:
        from filelock import FileLock

        self._folder = folder
        self._cls = FileLock
        self._locks: dict[str, Any] = {}
        self._held: Any = None

    def acquire(self, name: str) -> None:
        lock = self._locks.get(name)
        if lock is None:
            digest = hashlib.sha256(name.encode()).hexdigest()[:32]
            lock = self._locks[name] = self._cls(os.path.join(self._folder, digest + ".lock"))
        lock.acquire()
        self._held = lock

    def release(self) -> None:
        self._held.release()
        self._held = None


# -- the naive lock row (SQLite or PostgreSQL) -------------------------------------------------
def _is_postgres(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


class NaiveRowLock(LockAdapter):
    """The SPEC's naive answer: a lock row per name, taken when free or expired, retried every
    ``poll`` seconds while taken, 10-minute expiry, 30-second acquire timeout.

    ``target`` is a SQLite file (WAL; the row is read and written in one ``BEGIN IMMEDIATE``
    transaction, so it shares the file format and machine with Turnstile's backend) or a
    PostgreSQL URL (the table lives in ``schema``; one ``INSERT ... ON CONFLICT DO UPDATE ...
    WHERE expired`` per attempt). :meth:`create_table` makes the table first. ``relaxed``
    (PostgreSQL): its session commits with ``synchronous_commit = off``, the floor of
    Turnstile's ``durability=relaxed``. ``release_unflushed`` (PostgreSQL): only its release
    (the DELETE) commits without waiting for the disk, as Turnstile's durable default does
    for a release that grants nobody.
    """

    def __init__(
        self,
        target: str,
        schema: str | None = None,
        poll: float = 1.0,
        expiry: float = 600.0,
        timeout: float = 30.0,
        relaxed: bool = False,
        release_unflushed: bool = False,
    ) -> None:
        self._pg = _is_postgres(target)
        self._unflushed = (
            " AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
            if release_unflushed and self._pg
            else ""
        )
        if self._pg:
            import psycopg

            self._conn: Any = psycopg.connect(target, autocommit=True)
            if relaxed:
                self._conn.execute("SET synchronous_commit = off")
            self._table = f'"{schema}".naive_locks'
        else:
            self._conn = sqlite3.connect(target, timeout=30.0, isolation_level=None)
            self._table = "naive_locks"
        self._poll, self._expiry, self._timeout = poll, expiry, timeout
        self._owner = f"{socket.gethostname()}/{os.getpid()}"
        self._name: str | None = None

    @staticmethod
    def create_table(target: str, schema: str | None = None) -> None:
        """The lock table (on PostgreSQL in ``schema``, which must exist)."""
        if _is_postgres(target):
            import psycopg

            with psycopg.connect(target, autocommit=True) as conn:
                conn.execute(
                    f'CREATE TABLE "{schema}".naive_locks ('
                    " name text PRIMARY KEY, owner text NOT NULL, expires_at timestamptz NOT NULL)"
                )
            return
        with contextlib.closing(sqlite3.connect(target)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS naive_locks ("
                " name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL)"
            )

    def acquire(self, name: str) -> None:
        deadline = time.monotonic() + self._timeout
        while True:
            if self._try(name):
                self._name = name
                return
            if time.monotonic() + self._poll > deadline:
                raise TimeoutError(f"lock row {name!r} not acquired within {self._timeout} s")
            time.sleep(self._poll)

    def _try(self, name: str) -> bool:
        """One attempt: take the row if it is free or expired."""
        if self._pg:
            row = self._conn.execute(
                f"INSERT INTO {self._table} (name, owner, expires_at)"
                " VALUES (%s, %s, now() + %s * interval '1 second')"
                " ON CONFLICT (name) DO UPDATE"
                " SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at"
                f" WHERE {self._table}.expires_at <= now()"
                " RETURNING owner",
                (name, self._owner, self._expiry),
            ).fetchone()
            return row is not None
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            found = self._conn.execute(
                "SELECT expires_at FROM naive_locks WHERE name = ?", (name,)
            ).fetchone()
            now = time.time()
            free = found is None or found[0] <= now
            if free:
                self._conn.execute(
                    "INSERT OR REPLACE INTO naive_locks (name, owner, expires_at) VALUES (?, ?, ?)",
                    (name, self._owner, now + self._expiry),
                )
            self._conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
            raise
        return free

    def release(self) -> None:
        mark = "%s" if self._pg else "?"
        self._conn.execute(
            f"DELETE FROM {self._table} WHERE name = {mark} AND owner = {mark}{self._unflushed}",
            (self._name, self._owner),
        )
        self._name = None

    def close(self) -> None:
        self._conn.close()


class NotifyRowLock(NaiveRowLock):
    """The hand-rolled *push* lock on PostgreSQL: the naive row, but a waiter sleeps on LISTEN
    instead of a poll, and release deletes the row and NOTIFYs in one statement. Every waiter on
    the name wakes and they race (no line, so no FIFO); no lease renewal, no fencing token. One
    durable statement per hand-over plus a LISTEN wake-up: about the least any durable lock
    with push wake-ups can do, which makes it the floor to read Turnstile against.
    ``relaxed``: its session commits with ``synchronous_commit = off`` (the floor of
    Turnstile's ``durability=relaxed``)."""

    def __init__(
        self,
        url: str,
        schema: str,
        expiry: float = 600.0,
        timeout: float = 30.0,
        relaxed: bool = False,
    ) -> None:
        import psycopg

        super().__init__(
            url, schema, poll=1.0, expiry=expiry, timeout=timeout, relaxed=relaxed
        )
        self._listen = psycopg.connect(url, autocommit=True)
        self._heard: set[str] = set()

    @staticmethod
    def _channel(name: str) -> str:
        return "naive_" + hashlib.sha256(name.encode()).hexdigest()[:24]

    def acquire(self, name: str) -> None:
        channel = self._channel(name)
        if channel not in self._heard:  # listen before the first try: no release slips by
            self._listen.execute(f'LISTEN "{channel}"')
            self._heard.add(channel)
        deadline = time.monotonic() + self._timeout
        while True:
            if self._try(name):
                self._name = name
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"lock row {name!r} not acquired within {self._timeout} s")
            # Woken by a release on this name (or another we listen to: then just try again).
            for _ in self._listen.notifies(timeout=1.0, stop_after=1):
                pass

    def release(self) -> None:
        assert self._name is not None
        self._conn.execute(
            f"WITH gone AS (DELETE FROM {self._table} WHERE name = %s AND owner = %s"
            " RETURNING name) SELECT pg_notify(%s, '') FROM gone",
            (self._name, self._owner, self._channel(self._name)),
        )
        self._name = None

    def close(self) -> None:
        self._listen.close()
        super().close()


# -- PostgreSQL's own lock ---------------------------------------------------------------------
class PgAdvisoryLock(LockAdapter):
    """``pg_advisory_lock(key)`` on a session of the worker's own: PostgreSQL queues waiters
    and wakes the next one itself (fast and fair among sessions, but it dies with the
    connection, has no lease and no fencing token, and breaks behind a transaction pooler).

    The key is the first 8 bytes of the name's SHA-256, computed here: hashing in the server
    (``hashtextextended``) would add a round trip to every acquire that is not the lock's cost.
    """

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.key = 0

    def acquire(self, name: str) -> None:
        digest = hashlib.sha256(name.encode()).digest()
        self.key = int.from_bytes(digest[:8], "big", signed=True)
        self.conn.execute("SELECT pg_advisory_lock(%s)", (self.key,))

    def release(self) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))

    def close(self) -> None:
        self.conn.close()


# -- Redis lock libraries ----------------------------------------------------------------------
class RedisLibraryLock(LockAdapter):
    """What the Redis lock libraries' adapters share: one client of the worker's own, the
    run's key prefix, and the library's lock object of the current turn (``self.lock``, made
    by each subclass's :meth:`acquire`)."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self.redis, self.prefix = redis.Redis.from_url(url), prefix
        self.lock: Any = None

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.redis.close()


class RedisPyLock(RedisLibraryLock):
    """redis-py's ``Lock``: SET NX PX, and while blocked it sleeps ``sleep`` (0.1 s, the
    default) between attempts."""

    def acquire(self, name: str) -> None:
        self.lock = self.redis.lock(self.prefix + name, timeout=TTL)
        self.lock.acquire(blocking=True)


class PythonRedisLock(RedisLibraryLock):
    """python-redis-lock: SET NX, and a waiter BLPOPs a signal list the releaser pushes to."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis_lock

        super().__init__(url, prefix)
        self.mod = redis_lock

    def acquire(self, name: str) -> None:
        self.lock = self.mod.Lock(self.redis, self.prefix + name, expire=int(TTL))
        self.lock.acquire(blocking=True)


class PotteryRedlock(RedisLibraryLock):
    """pottery's ``Redlock`` on one master: SET NX PX, polling with a random sleep."""

    def __init__(self, url: str, prefix: str) -> None:
        from pottery import Redlock

        super().__init__(url, prefix)
        self.cls = Redlock

    def acquire(self, name: str) -> None:
        self.lock = self.cls(key=self.prefix + name, masters={self.redis}, auto_release_time=TTL)
        self.lock.acquire(blocking=True, timeout=-1)


class SherlockLock(RedisLibraryLock):
    """sherlock's ``RedisLock``: SET NX, retried every ``retry_interval`` (0.1 s default)."""

    def __init__(self, url: str, prefix: str) -> None:
        import sherlock

        super().__init__(url, prefix)
        self.mod = sherlock

    def acquire(self, name: str) -> None:
        self.lock = self.mod.RedisLock(
            self.prefix + name, client=self.redis, expire=int(TTL), timeout=600
        )
        if not self.lock.acquire(blocking=True):
            raise TimeoutError(f"sherlock did not acquire {name!r}")


class PortalockerRedisLock(RedisLibraryLock):
    """portalocker's ``RedisLock``: held while its pub/sub subscription lives; a waiter
    re-counts the channel's subscribers every ``check_interval``."""

    def __init__(self, url: str, prefix: str) -> None:
        import portalocker

        super().__init__(url, prefix)
        self.mod = portalocker

    def acquire(self, name: str) -> None:
        self.lock = self.mod.RedisLock(self.prefix + name, connection=self.redis, timeout=600)
        self.lock.acquire()


# -- queues ------------------------------------------------------------------------------------
class QueueAdapter(LockAdapter):
    """One worker process's handle on a queue. The workers' start line calls :meth:`acquire`
    and :meth:`release` once on a private name before timing begins: a queue uses them only
    to warm up (open connections)."""

    def release(self) -> None:
        return None

    def put(self, payload: Any, key: str | None = None) -> None:
        raise NotImplementedError

    def take(self, timeout: float) -> tuple[Any, Any] | None:
        """The next message's payload and a handle for :meth:`done`; ``None`` after
        ``timeout`` seconds without one."""
        raise NotImplementedError

    def done(self, handle: Any) -> None:
        return None


class WorkerLoopQueue(QueueAdapter):
    """A queue consumed by a library's own worker loop, which calls a handler per message
    (Turnstile's ``q.work``, procrastinate's ``Worker``) rather than being asked for the next
    one. The throughput scenario runs its consumer *as* that handler (:meth:`serve`), as a
    user's handler runs: handing each message to another thread and waiting for it back would
    charge the loop for two thread switches per message that its users never pay."""

    def serve(self, handler: Callable[[Any], bool]) -> None:
        """Run the worker loop in this thread, calling ``handler(payload)`` for each message
        it delivers, until ``handler`` returns True (that message is the consumer's last: the
        loop takes nothing more) and the loop has settled it."""
        raise NotImplementedError


class _TurnstileQueueHandle(QueueAdapter):
    """A Turnstile client and queue: what both ways of consuming it share."""

    def __init__(self, url: str, name: str, visibility_timeout: float = 30.0) -> None:
        import turnstile

        self.client = turnstile.connect(url)
        self.q = self.client.queue(name, visibility_timeout=visibility_timeout, max_attempts=5)
        self.url = url

    def acquire(self, name: str) -> None:
        warm = self.client.queue(name)
        warm.put(0)
        m = warm.get(timeout=5)
        if m is not None:
            m.ack()

    def put(self, payload: Any, key: str | None = None) -> None:
        self.q.put(payload, key=key)

    def close(self) -> None:
        self.client.close()


class TurnstileQueue(_TurnstileQueueHandle):
    """A Turnstile queue consumed with ``get`` and ``ack``."""

    def take(self, timeout: float) -> tuple[Any, Any] | None:
        m = self.q.get(timeout=timeout)
        return None if m is None else (m.payload, m)

    def done(self, handle: Any) -> None:
        handle.ack()


class TurnstileWorkQueue(_TurnstileQueueHandle, WorkerLoopQueue):
    """A Turnstile queue consumed by its own worker loop, ``q.work`` (one worker): the loop
    acks each message when its handler returns, on PostgreSQL in the same step as it claims
    the next (``queue_ack_claim``). ``prefetch`` > 1: it claims that many at a time and acks
    them with its next claim (on PostgreSQL one transaction per batch,
    ``queue_ack_claim_many``)."""

    def __init__(self, url: str, name: str, prefetch: int = 1) -> None:
        super().__init__(url, name)
        self.prefetch = prefetch

    def serve(self, handler: Callable[[Any], bool]) -> None:
        stopping = False

        def handle(message: Any) -> None:
            nonlocal stopping
            if stopping:
                # The rest of the batch this consumer holds: stop messages meant for the
                # other consumers (every real message came before them), put back for them.
                self.q.put(message.payload)
            elif handler(message.payload):
                stopping = True
                self.q.stop()  # take nothing more: the loop finishes the batch it holds

        self.q.work(handle, handle_signals=False, prefetch=self.prefetch)


class SkipLockedQueue(QueueAdapter):
    """The usual PostgreSQL table queue: ``DELETE ... WHERE id = (SELECT ... FOR UPDATE SKIP
    LOCKED LIMIT 1) RETURNING``, consumers woken by LISTEN/NOTIFY (NOTIFY per insert), in a
    schema of its own (a ``jobs`` table: :func:`servers.postgres_schema` makes it). No keys,
    no visibility timeout (a consumer's crash loses its message unless it keeps a transaction
    open), no cap. A message is deleted when taken, so :meth:`done` has nothing to do.
    ``batch`` > 1: each statement takes up to that many (``LIMIT batch``), handed out one by
    one before the next (a consumer's crash loses them all)."""

    def __init__(self, url: str, schema: str, batch: int = 1) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.schema = schema
        self.channel = f"q_{schema}"
        self.listen: Any = None
        self.batch = batch
        self.taken: list[Any] = []

    def acquire(self, name: str) -> None:
        self.conn.execute("SELECT 1")

    def put(self, payload: Any, key: str | None = None) -> None:
        self.conn.execute(
            f"WITH i AS (INSERT INTO {self.schema}.jobs (payload) VALUES (%s))"
            f" SELECT pg_notify('{self.channel}', '')",
            (json.dumps(payload),),
        )

    def _claim(self) -> Any:
        if self.batch == 1:
            return self.conn.execute(
                f"DELETE FROM {self.schema}.jobs WHERE id = (SELECT id FROM {self.schema}.jobs"
                " ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING payload"
            ).fetchone()
        if not self.taken:
            rows = self.conn.execute(
                f"DELETE FROM {self.schema}.jobs WHERE id IN (SELECT id FROM {self.schema}.jobs"
                " ORDER BY id FOR UPDATE SKIP LOCKED LIMIT %s) RETURNING id, payload",
                (self.batch,),
            ).fetchall()
            self.taken = [(payload,) for _, payload in sorted(rows, reverse=True)]
        if not self.taken:
            return None
        row = self.taken.pop()
        if isinstance(row[0], dict) and "stop" in row[0]:
            # The consumer's last (the throughput scenario's stop message): the rest of the
            # batch, stop messages meant for the other consumers, goes back for them.
            while self.taken:
                self.put(self.taken.pop()[0])
        return row

    def take(self, timeout: float) -> tuple[Any, Any] | None:
        import psycopg

        if self.listen is None:
            self.listen = psycopg.connect(self.conn.info.dsn, autocommit=True)
            self.listen.execute(f"LISTEN {self.channel}")
        end = time.monotonic() + timeout
        while True:
            row = self._claim()
            if row is not None:
                return row[0], None
            left = end - time.monotonic()
            if left <= 0:
                return None
            for _ in self.listen.notifies(timeout=min(left, 1.0), stop_after=1):
                break

    def close(self) -> None:
        self.conn.close()
        if self.listen is not None:
            self.listen.close()


class RQQueue(QueueAdapter):
    """RQ (``rq.SimpleWorker``: no fork per job) on the same Redis: enqueue a job; a consumer
    dequeues (BLPOP) and executes it with RQ's bookkeeping (job status, registries). The job
    is :func:`rq_jobs.record`, which hands the payload back to the consumer."""

    def __init__(self, url: str, name: str) -> None:
        import redis
        import rq

        self.redis = redis.Redis.from_url(url)
        self.queue = rq.Queue(name, connection=self.redis)
        self.worker: Any = None

    def acquire(self, name: str) -> None:
        self.redis.ping()

    def put(self, payload: Any, key: str | None = None) -> None:
        self.queue.enqueue("turnstile_bench.rq_jobs.record", payload, result_ttl=0)

    def take(self, timeout: float) -> tuple[Any, Any] | None:
        from rq.worker import SimpleWorker

        from . import rq_jobs

        if self.worker is None:
            self.worker = SimpleWorker([self.queue], connection=self.redis)
        got = self.worker.dequeue_job_and_maintain_ttl(max(1, math.ceil(timeout)))
        if got is None:
            return None
        job, queue = got
        rq_jobs.LAST.clear()
        self.worker.execute_job(job, queue)  # runs rq_jobs.record(payload)
        return rq_jobs.LAST[0], None

    def close(self) -> None:
        self.redis.close()


# -- store counters (probes, read in the parent) -----------------------------------------------
class CommandCounter:
    """Reads ``INFO commandstats`` in the parent: every command the server ran, including
    those run inside scripts, plus the client-sent script calls (EVALSHA and FCALL: Turnstile
    runs its lock steps as functions where the server has them) and BLPOP calls; and
    ``INFO cpu``: the server's CPU time (:data:`SERVER_CPU`, all its threads)."""

    def __init__(self, url: str, also: tuple[str, ...] = ()) -> None:
        self.url = url
        self.also = also  # more commands counted apart (e.g. "PUBLISH")

    def __call__(self) -> Mapping[str, float]:
        import redis

        with contextlib.closing(redis.Redis.from_url(self.url)) as r:
            stats = r.info("commandstats")
            cpu = r.info("cpu")
        calls = {k.removeprefix("cmdstat_"): float(v["calls"]) for k, v in stats.items()}
        calls.pop("info", None)  # our own reads
        return {
            # The server process's CPU (all its threads), to the microsecond.
            SERVER_CPU: float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            "Redis commands": sum(calls.values()),
            "scripts": calls.get("evalsha", 0.0) + calls.get("fcall", 0.0),
            "BLPOP": calls.get("blpop", 0.0),
            **{name: calls.get(name.lower(), 0.0) for name in self.also},
        }


class TransactionCounter:
    """Probe: writing transactions, counted exactly by the transaction ids the server
    assigned (``txid_current()`` before and after, minus the probe's own). Every Turnstile
    operation and every naive-row attempt writes (a row lock or a row), so for them this is
    every transaction; pg_advisory_lock writes nothing and shows 0.
    (``pg_stat_database.xact_commit`` would count read-only ones too, but an idle backend
    reports its statistics up to seconds late, so it undercounts short runs.)

    On a server of this machine (its backends are in ``/proc``) also :data:`SERVER_CPU`: the
    CPU time of the cluster's processes (the postmaster and its children: every client's
    backend, the WAL writer, the checkpointer, ...), except the probe's own backend. Counted
    per process from one reading to the next, so a process that started between them counts
    from its start and one that ended is left out (never a negative difference)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.calls = 0
        self._cpu: dict[int, float] = {}  # CPU seconds of each process at the last reading
        self._cpu_total = 0.0

    def __call__(self) -> dict[str, float]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            xid, backend = conn.execute(
                "SELECT txid_current(), pg_backend_pid()"
            ).fetchone()  # type: ignore[misc]
            cpu = _cluster_cpu(backend)
        # Each reading assigns one id itself; subtract the earlier readings' ids.
        self.calls += 1
        out = {"transactions": float(xid - self.calls)}
        if cpu is not None:
            self._cpu_total += cpu_since(self._cpu, cpu)
            self._cpu = cpu
            out[SERVER_CPU] = self._cpu_total
        return out


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_since(before: Mapping[int, float], now: Mapping[int, float]) -> float:
    """CPU seconds the processes of ``now`` (pid -> CPU seconds so far) spent since the
    reading ``before``: a process in both counts its difference, one that started since
    counts all of its time, one that ended since is left out (its last stretch is lost,
    never counted negative). A pid reused by a new process with less CPU counts from 0."""
    total = 0.0
    for pid, spent in now.items():
        earlier = before.get(pid, 0.0)
        total += spent - earlier if spent >= earlier else spent
    return total


def _proc_stat(pid: int) -> tuple[str, int, float] | None:
    """(command, parent pid, CPU seconds) of a process, None if unreadable. The CPU time is
    the scheduler's, to the nanosecond (``/proc/PID/schedstat``), where the kernel keeps it;
    else user + system time in clock ticks (``/proc/PID/stat``, 10 ms steps: too coarse for
    a run of a second)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICK
    with contextlib.suppress(OSError, ValueError, IndexError), open(
        f"/proc/{pid}/schedstat"
    ) as f:
        cpu = int(f.read().split()[0]) / 1e9
    return head.partition("(")[2], int(fields[1]), cpu


def cluster_cpu(postmaster: int, without: int | None = None) -> dict[int, float]:
    """CPU seconds of each process of the PostgreSQL cluster whose postmaster is
    ``postmaster`` (pid): the postmaster and its children (backends, the WAL writer, the
    checkpointer, ...), except ``without``."""
    out: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == without:
            continue
        stat = _proc_stat(int(entry))
        if stat is not None and (int(entry) == postmaster or stat[1] == postmaster):
            out[int(entry)] = stat[2]
    return out


def _cluster_cpu(backend: int) -> dict[int, float] | None:
    """:func:`cluster_cpu` of the cluster that ``backend`` (a backend's pid) belongs to,
    without ``backend`` itself; None when the server is not on this machine (no such
    postgres process here)."""
    mine = _proc_stat(backend)
    if mine is None or mine[0] != "postgres":
        return None
    return cluster_cpu(mine[1], without=backend)


class DramatiqQueue(QueueAdapter):
    """Dramatiq's ``RedisBroker`` under its own ``namespace`` (its keys start with it): put =
    ``actor.send``; a consumer is the broker's own consumer iterator (what a Dramatiq worker's
    consumer thread runs: a Lua fetch, and when the queue is empty it polls again after an
    exponential back-off up to ``timeout``), ``done`` = ``ack``. ``prefetch=1``, so a consumer
    holds one message at a time like every other queue here. No keys, no cap."""

    def __init__(self, url: str, namespace: str) -> None:
        import dramatiq
        from dramatiq.brokers.redis import RedisBroker

        self.broker = RedisBroker(url=url, namespace=namespace)
        self.queue_name = "bench"
        self.actor = dramatiq.actor(
            _dramatiq_record, broker=self.broker, queue_name=self.queue_name, actor_name="record"
        )
        self.consumer: Any = None

    def acquire(self, name: str) -> None:
        self.broker.client.ping()

    def put(self, payload: Any, key: str | None = None) -> None:
        self.actor.send(payload)

    def take(self, timeout: float) -> tuple[Any, Any] | None:
        if self.consumer is None:
            self.consumer = self.broker.consume(self.queue_name, prefetch=1, timeout=1000)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            message = next(self.consumer)
            if message is not None:
                return message.args[0], message
        return None

    def done(self, handle: Any) -> None:
        self.consumer.ack(handle)

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
        self.broker.close()


def _dramatiq_record(payload: Any) -> None:
    """The Dramatiq actor's body (never run: the benchmark consumes the broker directly)."""


class ProcrastinateQueue(WorkerLoopQueue):
    """procrastinate on PostgreSQL (its schema in a database of the run's own:
    :func:`servers.procrastinate_database`). put = defer a job (``lock=key`` when the message
    has a key: procrastinate's per-key serialisation, no two jobs with one lock run at once);
    a consumer runs procrastinate's own ``Worker`` (``concurrency=1``, LISTEN/NOTIFY, jobs
    deleted when done), whose task is the consumer's handler."""

    def __init__(self, url: str) -> None:
        import procrastinate

        self.url = url
        self.producer = procrastinate.App(
            connector=procrastinate.SyncPsycopgConnector(conninfo=url)
        )
        self.producer.task(name="bench_record")(_procrastinate_noop)
        self.producer.open()

    def acquire(self, name: str) -> None:
        self.producer.check_connection()

    def put(self, payload: Any, key: str | None = None) -> None:
        task = self.producer.tasks["bench_record"]
        task.configure(lock=key).defer(payload=payload)

    def serve(self, handler: Callable[[Any], bool]) -> None:
        import asyncio

        import procrastinate
        from procrastinate.worker import Worker

        async def main() -> None:
            app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=self.url))
            worker: Any = None

            @app.task(name="bench_record")
            async def record(payload: Any) -> None:
                if handler(payload):
                    worker.stop()  # fetch nothing more: this job is the consumer's last

            async with app.open_async():
                worker = Worker(
                    app,
                    concurrency=1,
                    wait=True,
                    listen_notify=True,
                    delete_jobs="always",
                    install_signal_handlers=False,
                )
                await worker.run()

        asyncio.run(main())

    def close(self) -> None:
        self.producer.close()


def _procrastinate_noop(payload: Any) -> None:
    """The producer's view of the task (it only defers; the consumer's worker runs it)."""
