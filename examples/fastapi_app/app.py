"""A FastAPI app: one async Turnstile client for the app's lifetime (opened in the lifespan),
and a per-order lock in a webhook route, so that webhooks of one order are applied one at a
time, in arrival order, across every worker process and host that shares the store.

Run it:

    pip install 'turnstile-locks[redis]' fastapi uvicorn
    TURNSTILE_URL=redis://localhost:6379/0 uvicorn app:app --workers 4

    curl -X POST localhost:8000/webhooks/orders/42 -H 'content-type: application/json' \\
         -d '{"event": "paid"}'

Without $TURNSTILE_URL it uses the default SQLite store,
``$XDG_STATE_HOME/turnstile/turnstile.db`` (every process of this user on this host).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException, Request

import turnstile.aio

# How long one webhook may take before another process could take the order over (renewed
# while the handler runs), and how long a webhook waits for its turn before giving up (the
# sender retries a 503 later).
LOCK_TTL = 30.0
WAIT_TIMEOUT = float(os.environ.get("ORDER_LOCK_TIMEOUT", "10"))


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # One client per process: it holds the store connections and the lease renewer.
    app.state.turnstile = await turnstile.aio.connect()  # $TURNSTILE_URL
    app.state.orders = {}  # order id -> events applied (stands in for your database)
    try:
        yield
    finally:
        await app.state.turnstile.close()


app = FastAPI(lifespan=lifespan)


async def apply_event(app_state: Any, order_id: str, event: dict[str, Any], token: int) -> None:
    """Your handler: read the order, apply the event, write it back. The fencing token
    goes with the write, so a store that checks it can refuse a stale writer."""
    events = app_state.orders.setdefault(order_id, [])
    seen = len(events)
    await asyncio.sleep(float(event.get("work_seconds", 0.01)))  # e.g. a call to a payment API
    assert len(events) == seen, "another webhook of this order ran meanwhile"
    events.append({"event": event.get("event"), "token": token})


@app.post("/webhooks/orders/{order_id}")
async def order_webhook(order_id: str, request: Request) -> dict[str, Any]:
    event = await request.json()
    client: turnstile.aio.AsyncClient = request.app.state.turnstile
    lock = client.lock(f"order:{order_id}", ttl=LOCK_TTL)
    try:
        async with lock.acquire(timeout=WAIT_TIMEOUT) as lease:
            await apply_event(request.app.state, order_id, event, lease.token)
    except turnstile.AcquireTimeout:
        raise HTTPException(503, "order busy, retry later", headers={"Retry-After": "5"}) from None
    return {"order": order_id, "applied": event.get("event"), "token": lease.token}


@app.get("/orders/{order_id}")
async def order(order_id: str, request: Request) -> dict[str, Any]:
    return {"order": order_id, "events": request.app.state.orders.get(order_id, [])}
