"""After a client's first operations, its operations import nothing anew, on every backend,
sync and async: an import of a module not yet in ``sys.modules`` searches ``sys.path``
again each time (Python caches no failed import). It is how httpcore cost the async HTTP
client about 0.1 ms per request while ``sniffio`` was missing (see
tests/unit/test_http_extra.py)."""

from __future__ import annotations

import turnstile
import turnstile.aio
from tests.contract import queue_harness
from tests.imports import imports_made

aqclient = queue_harness.aqclient  # the fixtures, for this module
qclient = queue_harness.qclient


def _ops(client: turnstile.Client) -> None:
    lock = client.lock("imports", ttl=30)
    with lock.acquire(timeout=5):
        lock.status()
    assert lock.try_acquire("other").acquired
    assert lock.release("other")
    q = client.queue("imports")
    q.put({"n": 1})
    message = q.get(timeout=5)
    assert message is not None and message.ack()


async def _aops(client: turnstile.aio.Client) -> None:
    lock = client.lock("imports", ttl=30)
    async with lock.acquire(timeout=5):
        await lock.status()
    assert (await lock.try_acquire("other")).acquired
    assert await lock.release("other")
    q = client.queue("imports")
    await q.put({"n": 1})
    message = await q.get(timeout=5)
    assert message is not None and await message.ack()


def test_sync_operations_import_nothing_anew(qclient: turnstile.Client) -> None:
    _ops(qclient)  # what a first use imports, it imports here
    with imports_made() as asked:
        for _ in range(3):
            _ops(qclient)
    assert asked == [], f"imported at every use: {sorted(set(asked))}"


async def test_async_operations_import_nothing_anew(aqclient: turnstile.aio.Client) -> None:
    await _aops(aqclient)
    with imports_made() as asked:
        for _ in range(3):
            await _aops(aqclient)
    assert asked == [], f"imported at every use: {sorted(set(asked))}"
