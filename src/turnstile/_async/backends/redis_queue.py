"""Queues on ``redis://`` / ``redis+cluster://``: one Lua script per operation
(``stores/redis/lua/queue/*.lua``), run through the client's shared connection
(``redis_connection.py``); a blocked consumer BLPOPs its own wake-up list on the
connection's separate blocking client, and the script that makes a message deliverable
pushes to the oldest registered waiter's list only."""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from ..._core.records import (
    BatchClaim,
    ClaimResult,
    DeadLetterRow,
    NewMessage,
    PutResult,
    QueueStats,
)
from ...stores.redis import keys, replies, scripts
from ...stores.redis.config import MAX_BLOCK
from ...stores.redis.driver import DRIVER_ERRORS
from .. import _compat
from .protocol import AsyncLocalQueueWaits

if TYPE_CHECKING:
    # The connection makes this backend (AsyncRedisConnection.queues), so it is imported
    # for types only.
    from .redis_connection import AsyncRedisConnection

log = logging.getLogger("turnstile.redis")


class AsyncRedisQueueWaiter:
    def __init__(self, queues: AsyncRedisQueueBackend, name: str) -> None:
        self.id = secrets.token_hex(8)
        self._queues = queues
        self._name = name
        self._key = keys.signal_key(queues.base(name), self.id)

    async def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            block = max(0.001, min(left, _compat.blocking_slice(MAX_BLOCK)))
            block = int(block * 1000 + 0.999) / 1000  # milliseconds, rounded up; 0 = forever
            try:
                client = self._queues.connection.blocking_client(self._key)
                if await client.blpop([self._key], timeout=block) is not None:
                    return True
            except DRIVER_ERRORS as exc:
                # The next claim reports a store that is really gone; only avoid spinning.
                log.debug("BLPOP failed: %s", exc)
                await _compat.sleep(min(max(left, 0.0), 0.05))
                return True

    async def close(self, registered: bool = True) -> None:
        if registered:
            await self._queues._run("unregister", self._name, [self.id])


class AsyncRedisQueueBackend(AsyncLocalQueueWaits):
    def __init__(self, connection: AsyncRedisConnection) -> None:
        self.connection = connection
        self._scripts = scripts.load("queue")

    def base(self, name: str) -> str:
        return keys.queue_base(self.connection.config.prefix, name)

    async def _run(self, op: str, name: str, args: list[Any]) -> Any:
        base = self.base(name)
        return await self.connection.run(
            self._scripts[op], keys.queue_keys(base), [base, *args], f"queue {op}",
            cancellable=False,
        )

    async def put(self, name: str, message: NewMessage, *, dedup_window: float) -> PutResult:
        reply = await self._run(
            "put",
            name,
            [
                name, message.id, message.key or "", message.body, message.kind,
                keys.micros(message.delay), message.dedup_id or "", message.max_attempts,
                keys.micros(dedup_window),
            ],
        )
        return replies.put_result(reply)

    async def claim(
        self,
        name: str,
        *,
        receipt: str,
        visibility_timeout: float,
        concurrency: int | None,
        max_attempts: int,
        waiter: str | None,
    ) -> ClaimResult:
        reply = await self._run(
            "claim",
            name,
            [
                name, receipt, keys.micros(visibility_timeout),
                -1 if concurrency is None else concurrency, max_attempts, waiter or "",
            ],
        )
        return replies.claim_result(reply, receipt)

    async def ack(self, name: str, id: str, receipt: str) -> bool:
        return int(await self._run("ack", name, [id, receipt])) == 1

    async def ack_claim_many(
        self,
        name: str,
        acks: list[tuple[str, str]],
        *,
        receipts: list[str],
        visibility_timeout: float,
        concurrency: int | None,
        max_attempts: int,
        waiter: str | None,
    ) -> tuple[list[bool], BatchClaim]:
        """The acks, then up to ``len(receipts)`` claims, in one script (one round trip); the
        worker loop's ``ack_claim`` is the batch of one (:class:`AsyncAckClaimByBatch`)."""
        if not receipts:
            raise ValueError("ack_claim_many needs at least one receipt")
        reply = await self._run(
            "ack_claim_many",
            name,
            [
                name, keys.micros(visibility_timeout),
                -1 if concurrency is None else concurrency, max_attempts, waiter or "",
                len(acks), *(part for pair in acks for part in pair), *receipts,
            ],
        )
        return replies.batch_result(reply, receipts)

    async def nack(
        self, name: str, id: str, receipt: str, *, delay: float, error: str | None
    ) -> bool:
        reply = await self._run(
            "nack",
            name,
            [id, receipt, keys.micros(delay), 0 if error is None else 1, error or ""],
        )
        return int(reply) == 1

    async def extend(self, name: str, id: str, receipt: str, seconds: float) -> float | None:
        reply = int(await self._run("extend", name, [id, receipt, keys.micros(seconds)]))
        return None if reply < 0 else reply / 1_000_000

    async def stats(self, name: str, *, top_keys: int) -> QueueStats:
        return replies.stats_result(name, await self._run("stats", name, [top_keys]))

    async def dead_letters(self, name: str, *, limit: int) -> list[DeadLetterRow]:
        return replies.dead_result(await self._run("dead", name, [limit]))

    async def requeue(self, name: str, ids: list[str] | None) -> int:
        if ids is not None and not ids:
            return 0
        return int(await self._run("requeue", name, list(ids or [])))

    async def purge_dead(self, name: str, ids: list[str] | None) -> int:
        if ids is not None and not ids:
            return 0
        return int(await self._run("purge", name, list(ids or [])))

    async def names(self, prefix: str, max_count: int) -> list[str]:
        async def probe(base: str) -> Any:  # the queue's name if it holds messages
            return await self.connection.run(
                self._scripts["names"], keys.queue_keys(base), [base], "list queues",
                cancellable=False,
            )

        # "<prefix>{T}:q:meta" -> "<prefix>{T}:q:"
        pattern = keys.queue_meta_pattern(self.connection.config.prefix)
        return await self.connection.scan_names(pattern, "meta", probe, prefix, max_count)

    async def open_waiter(self, name: str) -> AsyncRedisQueueWaiter:
        return AsyncRedisQueueWaiter(self, name)

