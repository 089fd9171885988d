"""``q.work``'s extender and a settlement that cross: an extension that finds the receipt
stale because the message's own ack just went through must not count the message as lost
(the store accepted the ack). Made deterministic with a store whose ack returns only once an
extension of the acked message has been answered."""

from __future__ import annotations

import threading
from typing import Any

import turnstile
from turnstile._sync.backends.protocol import LocalQueueWaits
from turnstile._sync.queue import Queue


class AckWaitsForAnExtension(LocalQueueWaits):
    """The memory store's queues, but ``ack`` answers only after an ``extend`` has been
    answered (stale: the message is acked by then)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.extended = threading.Event()
        self.stale_extensions = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def ack(self, name: str, id: str, receipt: str) -> bool:
        ok: bool = self.inner.ack(name, id, receipt)
        assert self.extended.wait(30), "the extender never extended the message"
        return ok

    def extend(self, name: str, id: str, receipt: str, seconds: float) -> float | None:
        deadline: float | None = self.inner.extend(name, id, receipt, seconds)
        if deadline is None:
            self.stale_extensions += 1
        self.extended.set()
        return deadline


def test_an_extension_overtaken_by_the_handlers_ack_does_not_lose_the_message() -> None:
    client = turnstile.connect("memory://")
    try:
        store = AckWaitsForAnExtension(client._queues())
        # visibility 0.3 s: the running message is due for extension 0.1 s after its claim.
        q = Queue(store, "crossing", visibility_timeout=0.3, long_poll_gets=False)
        q.put("x")

        def handler(m: turnstile.Message) -> None:
            assert m.ack()  # the handler settles it itself; the ack waits for an extension

        result = q.work(handler, max_messages=1, handle_signals=False)
        assert store.stale_extensions == 1  # the extension did find it acked
        assert (result.acked, result.lost) == (1, 0)
        assert q.stats().pending == 0
    finally:
        client.close()
