"""The reconciler: frees the permits of ended Step Functions executions without events.

With the EventBridge rule in place (docs/workflows.md) the bridge learns of an ended
execution at once. Without it, an execution that dies while holding (stopped, failed,
timed out, its Catch missing) keeps its permit until the lease's ttl runs out. The
reconciler shortens that: every ``interval`` seconds it reads the active names, and for each
name that **has waiters** (a dead holder harms nobody while nobody waits) it asks Step
Functions ``DescribeExecution`` about each holder whose holder id is an execution ARN, at
most once per holder per ``interval``. A holder whose execution is no longer ``RUNNING``
(or does not exist) is released, scoped by its token.

Cost: one ``names()`` and one ``status()`` per active name per interval on the store; on
AWS, nothing at all while nobody waits, else at most one DescribeExecution per
execution-holder per interval (its default, 10 s, keeps a 100-holder semaphore at 10 calls a
second, well under the API's default quota).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._async.client import AsyncClient
from .._core import validate
from ..errors import TurnstileError
from . import aws, threads

log = logging.getLogger("turnstile.workflows")

DEFAULT_INTERVAL = 10.0
RUNNING = "RUNNING"
GONE = "GONE"  # DescribeExecution: ExecutionDoesNotExist
UNKNOWN = "UNKNOWN"  # could not tell (throttled, access denied, network): keep the permit


def describe(execution_arn: str) -> str:
    """The status of an execution: RUNNING, SUCCEEDED…, GONE, or UNKNOWN."""
    try:
        found = aws.client("stepfunctions").describe_execution(executionArn=execution_arn)
    except Exception as exc:  # botocore's errors, the network's
        if aws.error_code(exc) == "ExecutionDoesNotExist":
            return GONE
        return UNKNOWN
    return str(found.get("status") or UNKNOWN)


@dataclass
class ReconcilerStats:
    rounds: int = 0
    described: int = 0  # DescribeExecution calls
    released: int = 0


class Reconciler:
    """Releases grants of execution-holders that ended, on names with waiters."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        interval: float = DEFAULT_INTERVAL,
        on_release: Callable[[], None] | None = None,
        describer: Callable[[str], str] = describe,
    ) -> None:
        self._client = client
        self._interval = validate.seconds(interval, "interval", low=0.1, high=86400.0)
        self._on_release = on_release
        self._describe = describer
        self._asked: dict[str, float] = {}  # holder -> monotonic time of its last describe
        self._task: asyncio.Task[None] | None = None
        self._warned = False
        self.stats = ReconcilerStats()

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="reconciler")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            try:
                await self.round()
                self._warned = False
            except TurnstileError as exc:
                if not self._warned:
                    self._warned = True
                    log.warning("reconciler cannot reach the store: %s", exc)
            await asyncio.sleep(self._interval)

    async def round(self) -> int:
        """One pass over the active names; returns how many grants it released."""
        self.stats.rounds += 1
        released = 0
        now = time.monotonic()
        seen: set[str] = set()
        states: dict[str, str] = {}  # described in this round
        for name in await self._client.names("", 100_000):
            status = await self._client.status(name)
            if not status.waiters:
                continue
            for held in status.holders:
                if not aws.is_execution(held.holder):
                    continue
                seen.add(held.holder)
                state = states.get(held.holder)
                if state is None:
                    last = self._asked.get(held.holder)
                    if last is not None and now - last < self._interval:
                        continue
                    self._asked[held.holder] = now
                    self.stats.described += 1
                    state = await threads.call(self._describe, held.holder)
                    states[held.holder] = state
                if state in (RUNNING, UNKNOWN):
                    continue
                semaphore = self._client.semaphore(name, status.limit or 1)
                if await semaphore.release(held.holder, held.token):
                    released += 1
                    log.info(
                        "released grant %d of %r: its execution is %s", held.token, name, state
                    )
        # Forget holders no longer seen, so the table stays as small as the live ones.
        for holder in list(self._asked):
            if holder not in seen:
                del self._asked[holder]
        self.stats.released += released
        if released and self._on_release is not None:
            self._on_release()
        return released
