"""An AWS Lambda handler that serializes work per order with a Turnstile lock.

Lambda may run many copies of a function at once, and retries deliveries: two events of
one order can run concurrently on different instances. The handler takes the order's lock
for as long as the invocation can still run (``context.get_remaining_time_in_millis()``),
so a waiting invocation gives up before Lambda kills it, and a killed one frees the order
within the lease time.

Deploy with ``turnstile-locks[redis]`` or ``turnstile-locks[postgres]`` in the package and
``TURNSTILE_URL`` in the function's environment (a store reachable from the VPC).
"""

from __future__ import annotations

import time
from typing import Any

import turnstile

# Created once per Lambda instance (outside the handler) and reused by every invocation
# it serves; Turnstile opens the connections on first use.
CLIENT = turnstile.connect()  # $TURNSTILE_URL

# Keep this much time to do the work and answer after the lock is granted.
WORK_RESERVE_S = 1.0
# Never let a lease outlive the invocation by much: ttl = what is left of the invocation
# (renewed while the work runs, so only a killed invocation holds it that long).
MIN_TTL_S = 1.0


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    order_id = str(event["order_id"])
    remaining = context.get_remaining_time_in_millis() / 1000.0
    wait = max(0.0, remaining - WORK_RESERVE_S)
    lock = CLIENT.lock(f"order:{order_id}", ttl=max(MIN_TTL_S, remaining))
    try:
        lease = lock.acquire(timeout=wait)
    except turnstile.AcquireTimeout:
        # Let Lambda retry the event (or send it to the DLQ) rather than run it in parallel.
        return {"statusCode": 409, "body": f"order {order_id} busy for {wait:.1f} s"}
    with lease:
        result = process(order_id, event)
    return {"statusCode": 200, "body": result, "token": lease.token}


def process(order_id: str, event: dict[str, Any]) -> str:
    """Your work, one invocation per order at a time."""
    time.sleep(float(event.get("work_seconds", 0)))
    return f"order {order_id}: {event.get('event', 'processed')}"
