"""A Celery task guarded by a Turnstile semaphore: however many Celery workers and
processes run ``render_invoice``, at most ``RENDERERS`` run its expensive part at once
(say, a PDF service that accepts only that many connections), granted in arrival order.

Run it:

    pip install 'turnstile-locks[redis]' celery
    TURNSTILE_URL=redis://localhost:6379/0 celery -A tasks worker --concurrency 8

The broker is Celery's business (``CELERY_BROKER_URL``; the tests use Celery's
``filesystem://`` transport in a folder named by ``CELERY_BROKER_FOLDER`` and a ``file://``
result backend, so they need no broker server); the semaphore lives in the Turnstile store,
shared by every worker process on every host.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from celery import Celery

import turnstile

RENDERERS = int(os.environ.get("RENDERERS", "2"))
WAIT_TIMEOUT = 120.0  # give up (and let Celery retry) after this long in line

BROKER = os.environ.get("CELERY_BROKER_URL", "redis://localhost:6379/1")
app = Celery("tasks", broker=BROKER, backend=os.environ.get("CELERY_RESULT_BACKEND"))
if BROKER.startswith("filesystem://"):
    folder = os.environ["CELERY_BROKER_FOLDER"]
    app.conf.broker_transport_options = {
        "data_folder_in": folder,
        "data_folder_out": folder,
        "control_folder": os.path.join(folder, "control"),  # default: ./control
    }

_client: turnstile.Client | None = None
_client_lock = threading.Lock()


def client() -> turnstile.Client:
    """One Turnstile client per worker process, opened on first use (a forked worker
    child opens its own connections; Turnstile handles the fork)."""
    global _client
    with _client_lock:
        if _client is None:
            _client = turnstile.connect()  # $TURNSTILE_URL
        return _client


@app.task(bind=True, max_retries=5, name="tasks.render_invoice")
def render_invoice(self: Any, invoice_id: int, work_seconds: float = 0.05) -> dict[str, Any]:
    renderers = client().semaphore("invoices:renderer", limit=RENDERERS, ttl=60)
    try:
        lease = renderers.acquire(timeout=WAIT_TIMEOUT)
    except turnstile.AcquireTimeout as exc:
        raise self.retry(exc=exc, countdown=10) from None
    with lease:  # renewed while rendering, released after
        started = time.time()
        time.sleep(work_seconds)  # the expensive call
        return {
            "invoice": invoice_id,
            "token": lease.token,
            "started": started,
            "ended": time.time(),
        }
