"""After a client's first operations, its operations import nothing anew, on every backend,
sync and async: an import of a module not yet in ``sys.modules`` searches ``sys.path``
again each time (Python caches no failed import). It is how httpcore cost the async HTTP
client about 0.1 ms per request while ``sniffio`` was missing (see
tests/unit/test_http_extra.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import turnstile
import turnstile.aio
from tests.contract import queue_harness

aqclient = queue_harness.aqclient  # the fixtures, for this module
qclient = queue_harness.qclient


class _Counting:
    """A meta path finder that finds nothing and records what it was asked for: only an
    import of a module not in ``sys.modules`` reaches it."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        self.asked.append(name)
        return None


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
    finder = _Counting()
    sys.meta_path.insert(0, finder)  # type: ignore[arg-type]
    try:
        for _ in range(3):
            _ops(qclient)
    finally:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]
    assert finder.asked == [], f"imported at every use: {sorted(set(finder.asked))}"


async def test_async_operations_import_nothing_anew(aqclient: turnstile.aio.Client) -> None:
    await _aops(aqclient)
    finder = _Counting()
    sys.meta_path.insert(0, finder)  # type: ignore[arg-type]
    try:
        for _ in range(3):
            await _aops(aqclient)
    finally:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]
    assert finder.asked == [], f"imported at every use: {sorted(set(finder.asked))}"
