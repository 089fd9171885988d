"""The waiters of a client take turns reading its listening connection (``wakeups.py``): a
reader that leaves offers the turn to one waiter that is waiting, never to a waiter that is
registered but not in a wait (a queue's spare), and an offer that goes unused when its
waiter closes is passed on. No server: the listener's connection is a stand-in that reads
nothing."""

from __future__ import annotations

import logging
import threading
import time

from turnstile._sync import _compat
from turnstile._sync.backends.wakeups import WakeListener, WakeWaiter


class _Listener(WakeListener):
    """Up at once; a read returns after its slice, or as soon as the reader's event is set."""

    def __init__(self) -> None:
        super().__init__("test", logging.getLogger("test"))
        self.readers: list[str] = []
        self.slices: list[float] = []
        self._listening()

    @property
    def started(self) -> bool:
        return True

    def _read(self, seconds: float, until: _compat.Event | None) -> None:
        self.readers.append(threading.current_thread().name)
        self.slices.append(seconds)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (until is not None and until.is_set()):
            time.sleep(0.001)

    def close(self) -> None:
        self._stop.set()


def test_the_turn_goes_to_a_waiting_waiter_not_to_a_spare() -> None:
    listener = _Listener()
    spare = WakeWaiter(listener, "spare")  # registered, never in a wait
    leaving = WakeWaiter(listener, "leaving")
    waiting = WakeWaiter(listener, "waiting")
    waiting.waiting = True
    listener.offer_turn(leaving)
    assert waiting._offered and not spare._offered
    for w in (spare, leaving, waiting):
        w.close()


def test_a_reader_that_leaves_hands_the_turn_on() -> None:
    """Two waiters: the first reads (the second waits on its event), is woken, and leaves;
    the second is offered the turn and reads from then on, until its own wake-up."""
    listener = _Listener()
    first, second = WakeWaiter(listener, "first"), WakeWaiter(listener, "second")
    results: dict[str, bool] = {}

    def wait(waiter: WakeWaiter, name: str) -> None:
        results[name] = waiter.wait(30.0)

    a = threading.Thread(target=wait, args=(first, "first"), name="first")
    a.start()
    while listener.readers[-1:] != ["first"]:
        time.sleep(0.001)
    b = threading.Thread(target=wait, args=(second, "second"), name="second")
    b.start()
    while not second.waiting:
        time.sleep(0.001)
    listener._dispatch("first ")  # the first one's wake-up, read by itself
    a.join(10)
    assert results == {"first": True}
    deadline = time.monotonic() + 10
    while listener.readers[-1:] != ["second"]:  # offered the turn when the first left
        assert time.monotonic() < deadline, listener.readers
        time.sleep(0.001)
    listener._dispatch("second ")
    b.join(10)
    assert results == {"first": True, "second": True}
    first.close()
    second.close()


def test_an_offer_left_unused_is_passed_on_when_its_waiter_closes() -> None:
    listener = _Listener()
    offered, other = WakeWaiter(listener, "offered"), WakeWaiter(listener, "other")
    other.waiting = True
    offered.offer()  # the turn was offered to it, and it closes without waiting again
    offered.close()
    assert other._offered
    other.close()


class _Batches(WakeListener):
    """The base's read loop over a stand-in connection: ``batches`` are what successive
    reads find (a list of payloads; an empty list: nothing came within the timeout)."""

    def __init__(self, batches: list[list[str]]) -> None:
        super().__init__("test", logging.getLogger("test"))
        self.batches = batches
        self.reads = 0
        self.kept_alive = 0

    def _read_some(self, conn: object, timeout: float) -> bool:
        self.reads += 1
        batch = self.batches.pop(0) if self.batches else []
        for payload in batch:
            self._dispatch(payload)
        return bool(batch)

    def _keep_alive(self, conn: object) -> None:
        self.kept_alive += 1


def test_the_read_loop_stops_when_nothing_comes_and_keeps_the_rest_after_its_own() -> None:
    listener = _Batches([["a "], ["b "], []])
    a, b = WakeWaiter(listener, "a"), WakeWaiter(listener, "b")
    listener._quiet_since = time.monotonic()
    listener._read_from(object(), time.monotonic() + 30, None)
    assert listener.reads == 3  # both batches, then a read that found nothing
    assert a._woken and b._woken
    # With the reader's own event: it stops right after the batch that set it.
    listener.batches = [["a "], ["b "]]
    a._event.clear()
    b._woken = False
    listener._read_from(object(), time.monotonic() + 30, a._event)
    assert listener.batches == [["b "]] and not b._woken
    assert listener.kept_alive == 0  # it spoke lately
    a.close()
    b.close()


def test_a_connection_quiet_for_too_long_is_checked() -> None:
    listener = _Batches([])
    listener._quiet_since = time.monotonic() - 60  # quiet for a minute (LISTEN_PING: 15 s)
    listener._read_from(object(), time.monotonic() + 0.01, None)
    assert listener.kept_alive == 1
    listener._quiet_since = time.monotonic()
    listener.batches = [["x "]]
    listener._read_from(object(), time.monotonic() + 0.01, None)
    assert listener.kept_alive == 1 and time.monotonic() - listener._quiet_since < 5


def test_the_main_thread_reads_in_short_slices() -> None:
    """A read blocks in the kernel until it ends: in the main thread a sync waiter reads at
    most SIGNAL_POLL at a time, so that a signal handler runs soon; another thread reads up
    to READ_SLICE (the real-process check: test_signals_while_waiting.py)."""
    assert threading.current_thread() is threading.main_thread()
    listener = _Listener()
    waiter = WakeWaiter(listener, "main")
    assert waiter.wait(0.5) is False
    assert listener.slices and max(listener.slices) <= _compat.SIGNAL_POLL
    waiter.close()
    other = WakeWaiter(listener, "other")
    listener.slices.clear()
    thread = threading.Thread(target=other.wait, args=(0.5,))
    thread.start()
    thread.join(10)
    assert listener.slices[0] > _compat.SIGNAL_POLL  # the whole wait, up to READ_SLICE
    other.close()
    assert _compat.blocking_slice(5.0) == _compat.SIGNAL_POLL  # in the main thread
