"""The Lambda helper (issue 16 point 6): the ttl follows the invocation's remaining time, one
client is reused across invocations, the wait ends before the invocation's deadline.

Lambda itself is not needed (nor emulated): a handler is a function called with an event and
a context object, so these tests call handlers with a context that has the two members the
helper reads, on a real SQLite store shared by threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import turnstile
from turnstile.workflows import aws_lambda
from turnstile.workflows.aws_lambda import lambda_lease, sequential_handler


@dataclass
class Context:
    """The two members of Lambda's context object the helper reads; the deadline is real."""

    aws_request_id: str
    timeout: float
    started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.started + self.timeout - time.monotonic()) * 1000))


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'lambda.db'}"
    aws_lambda.forget_clients()


def test_the_lease_lasts_the_remaining_time_plus_grace(url: str) -> None:
    context = Context("req-1", timeout=30.0)
    with lambda_lease(context, "db", url=url, grace=2.0) as lease:
        ttl = lease.expires_at - turnstile.connect(url).status("db").now
        assert 32.0 - 1.0 < ttl <= 32.0  # 30 s remaining + 2 s grace, less the time spent
        assert lease.holder == "req-1"
    assert aws_lambda.shared_client(url).status("db").holders == ()


def test_one_client_is_kept_across_invocations(url: str) -> None:
    seen: list[Any] = []

    @sequential_handler(lambda event, context: f"order:{event['id']}", url=url)
    def handler(event: dict[str, Any], context: Context) -> str:
        seen.append(aws_lambda.shared_client(url))
        return str(event["id"])

    assert handler({"id": 1}, Context("a", 10)) == "1"
    assert handler({"id": 2}, Context("b", 10)) == "2"
    assert seen[0] is seen[1]


def test_invocations_of_one_key_run_one_at_a_time_in_arrival_order(url: str) -> None:
    order: list[str] = []
    inside = threading.Lock()
    overlaps = []

    @sequential_handler(lambda event, context: f"order:{event['order']}", url=url)
    def handler(event: dict[str, Any], context: Context) -> None:
        if not inside.acquire(blocking=False):
            overlaps.append(event["n"])
            return
        try:
            order.append(event["n"])
            time.sleep(0.05)
        finally:
            inside.release()

    client = aws_lambda.shared_client(url)
    threads = []
    for n in range(5):
        t = threading.Thread(target=handler, args=({"order": 7, "n": n}, Context(f"r{n}", 30)))
        t.start()
        threads.append(t)
        # The next asks only once this one is in line (or holds): arrival order is known.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = client.status("order:7")
            if (
                f"r{n}" in [h.holder for h in status.holders] + [w.holder for w in status.waiters]
                or n in order
            ):
                break
            time.sleep(0.005)
    for t in threads:
        t.join(30)
    assert overlaps == []
    assert order == [0, 1, 2, 3, 4]


def test_the_wait_ends_before_the_invocation_does(url: str) -> None:
    holder = turnstile.connect(url).lock("busy", ttl=60).acquire(timeout=5, holder="other")
    context = Context("late", timeout=2.0)
    started = time.monotonic()
    with (
        pytest.raises(turnstile.AcquireTimeout),
        lambda_lease(context, "busy", url=url, reserve=1.0),
    ):
        pass
    waited = time.monotonic() - started
    assert waited < 2.0  # left the line with time to spare, before the invocation's deadline
    assert [w.holder for w in aws_lambda.shared_client(url).status("busy").waiters] == []
    holder.release()
    with (
        pytest.raises(turnstile.AcquireTimeout, match="less than reserve"),
        lambda_lease(Context("no-time", timeout=0.5), "busy", url=url, reserve=1.0),
    ):
        pass


def test_a_wrong_context_is_a_clear_error(url: str) -> None:
    with (
        pytest.raises(turnstile.InvalidArgument, match="Lambda context"),
        lambda_lease(
            object(),  # type: ignore[arg-type]
            "x",
            url=url,
        ),
    ):
        pass


def test_after_a_wait_the_lease_still_ends_with_the_invocation(url: str) -> None:
    """The ttl runs from the grant: an invocation that waited in line must not get a lease
    that outlives it by the time it waited."""
    client = turnstile.connect(url)
    other = client.lock("queued", ttl=60).acquire(timeout=5, holder="other")
    timeout, grace, waited = 6.0, 1.0, 2.0
    context = Context("waits", timeout=timeout)
    releaser = threading.Timer(waited, other.release)
    releaser.start()
    try:
        with lambda_lease(context, "queued", url=url, grace=grace) as lease:
            left = context.get_remaining_time_in_millis() / 1000
            now = client.status("queued").now
            # Ends about when the invocation does (plus the grace), not a whole ttl later.
            assert lease.expires_at - now <= left + grace + 0.5
            assert lease.expires_at - now < timeout + grace - waited + 0.5
    finally:
        releaser.join()
        client.close()
