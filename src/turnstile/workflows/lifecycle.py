"""When a Step Functions execution ends: free everything it holds and every place it waits in.

An execution that holds a permit and dies (stopped, failed, timed out) never sends its
release; an execution that dies while waiting keeps its place in line until its ``wait_ttl``
lapses. :func:`free_execution` frees both at once, given the execution's ARN (its holder id,
``$$.Execution.Id``). The SQS bridge calls it for each EventBridge "Step Functions Execution
Status Change" event whose status is final (:func:`ended_execution` reads such an event);
the HTTP service may expose it the same way.

Cost: the store keeps no index from holder to names, so this reads every active name: one
``names()`` call, then one ``status()`` per name that has holders or waiters, then one
release per grant or place found. That is O(active names) store round trips per ended
execution; fine for hundreds of active names, worth a ``prefix`` (the names an ASL uses,
e.g. ``"order:"``) beyond that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .._async.client import AsyncClient
from .._core import validate
from . import aws

log = logging.getLogger("turnstile.workflows")

STATUS_CHANGE = "Step Functions Execution Status Change"
SOURCE = "aws.states"
# How many active names one sweep reads (the store lists names in code-point order).
MAX_NAMES = 100_000


@dataclass
class Freed:
    """What :func:`free_execution` released: ``(name, token)`` of each grant, and the names
    whose line the execution left."""

    grants: list[tuple[str, int]] = field(default_factory=list)
    places: list[str] = field(default_factory=list)
    names_read: int = 0

    @property
    def anything(self) -> bool:
        return bool(self.grants or self.places)

    def as_dict(self) -> dict[str, Any]:
        return {
            "grants": [{"name": n, "token": t} for n, t in self.grants],
            "places": list(self.places),
            "names_read": self.names_read,
        }


def ended_execution(event: Any) -> str | None:
    """The execution ARN of an EventBridge "Step Functions Execution Status Change" event
    with a final status (SUCCEEDED, FAILED, TIMED_OUT, ABORTED), else None (another event,
    or a RUNNING one). ``event`` is the decoded JSON object."""
    if not isinstance(event, dict) or event.get("detail-type") != STATUS_CHANGE:
        return None
    detail = event.get("detail")
    if not isinstance(detail, dict) or detail.get("status") not in aws.ENDED:
        return None
    arn = detail.get("executionArn")
    if not isinstance(arn, str) or not aws.is_execution(arn):
        return None
    return arn


def is_status_change(event: Any) -> bool:
    """Whether ``event`` is an EventBridge Step Functions status-change event (any status)."""
    return isinstance(event, dict) and event.get("detail-type") == STATUS_CHANGE


async def free_execution(
    client: AsyncClient, execution_arn: str, *, prefix: str = "", max_names: int = MAX_NAMES
) -> Freed:
    """Release every grant ``execution_arn`` holds (each scoped by its token, so a grant made
    to a later run of the same holder is never touched) and take it out of every line it
    waits in, across the names starting with ``prefix``. Idempotent: a second call finds
    nothing. See the module docstring for the cost."""
    holder = validate.holder(execution_arn, "executionArn")
    freed = Freed()
    for name in await client.names(prefix, max_names):
        freed.names_read += 1
        status = await client.status(name)
        semaphore = client.semaphore(name, status.limit or 1)
        for held in status.holders:
            if held.holder == holder and await semaphore.release(holder, held.token):
                freed.grants.append((name, held.token))
        if any(w.holder == holder for w in status.waiters):
            # Without a token: the place in line, and a grant made since the status was read.
            await semaphore.release(holder)
            freed.places.append(name)
    if freed.anything:
        log.info(
            "execution ended: released %d grant(s), left %d line(s)",
            len(freed.grants),
            len(freed.places),
        )
    return freed
