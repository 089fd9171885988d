"""OpenTelemetry spans and metrics from the client library (`_core/telemetry.py`), read back
with the SDK's in-memory span exporter and metric reader, against real stores."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import turnstile
import turnstile.aio
from tests.conftest import BackendUnderTest
from turnstile._core import telemetry

pytestmark = pytest.mark.timeout(120)

EXPORTER = InMemorySpanExporter()
READER = InMemoryMetricReader()
TRACER_PROVIDER = TracerProvider()
TRACER_PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture(autouse=True, scope="module")
def otel() -> Iterator[None]:
    """The SDK, given to Turnstile's telemetry for this module only (the global API is left
    alone, so the rest of the test run reports nowhere)."""
    meter_provider = MeterProvider(metric_readers=[READER])
    telemetry.configure(TRACER_PROVIDER, meter_provider)
    try:
        yield
    finally:
        telemetry.configure()
        meter_provider.shutdown()


@pytest.fixture(autouse=True)
def fresh_spans() -> None:
    EXPORTER.clear()


def spans(name: str, target: str) -> list[ReadableSpan]:
    return [
        s
        for s in EXPORTER.get_finished_spans()
        if s.name == name and (s.attributes or {}).get("turnstile.name") == target
    ]


def points(metric: str, target: str) -> list[Any]:
    """Data points of ``metric`` whose turnstile.name is ``target`` (cumulative)."""
    data = READER.get_metrics_data()
    found: list[Any] = []
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            if sm.scope.name != "turnstile":
                continue
            for m in sm.metrics:
                if m.name == metric:
                    found += [
                        p
                        for p in m.data.data_points
                        if p.attributes.get("turnstile.name") == target
                    ]
    return found


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def test_acquire_at_once(backend: BackendUnderTest) -> None:
    name = unique("fast")
    with turnstile.connect(backend.url) as client, client.lock(name, 5).acquire(timeout=10):
        pass
    [span] = spans("turnstile.acquire", name)
    attrs = dict(span.attributes or {})
    assert attrs["turnstile.outcome"] == "granted"
    assert attrs["turnstile.limit"] == 1
    assert "turnstile.position" not in attrs
    assert not [e for e in span.events if e.name == "turnstile.handover"]
    [wait] = points("turnstile.acquire.wait", name)
    assert wait.count == 1 and wait.attributes["turnstile.outcome"] == "granted"
    assert wait.attributes["turnstile.queued"] is False
    assert points("turnstile.handovers", name) == []


def test_acquire_after_waiting_is_a_handover_with_its_position(backend: BackendUnderTest) -> None:
    name = unique("line")
    with turnstile.connect(backend.url) as client:
        lock = client.lock(name, 10)
        first = lock.acquire(timeout=10)
        got: list[turnstile.Lease] = []
        waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=60)))
        waiter.start()
        deadline = time.monotonic() + 30
        while not client.status(name).waiters:
            assert time.monotonic() < deadline, "the second acquire never joined the line"
            time.sleep(0.01)
        held_for = 0.2
        time.sleep(held_for)
        first.release()
        waiter.join(60)
        assert got
        got[0].release()
    acquires = spans("turnstile.acquire", name)
    assert len(acquires) == 2
    queued = [s for s in acquires if "turnstile.position" in (s.attributes or {})]
    assert len(queued) == 1
    attrs = dict(queued[0].attributes or {})
    assert attrs["turnstile.position"] == 0
    assert attrs["turnstile.outcome"] == "granted"
    assert attrs["turnstile.token"] == got[0].token
    assert attrs["turnstile.wait_seconds"] >= held_for
    [event] = [e for e in queued[0].events if e.name == "turnstile.handover"]
    assert (event.attributes or {})["turnstile.token"] == got[0].token
    [handovers] = points("turnstile.handovers", name)
    assert handovers.value == 1
    [position] = points("turnstile.acquire.position", name)
    assert position.count == 1 and position.sum == 0
    waits = {p.attributes["turnstile.queued"]: p for p in points("turnstile.acquire.wait", name)}
    assert waits[True].count == 1 and waits[True].sum >= held_for
    assert waits[False].count == 1


def test_acquire_timeout(backend: BackendUnderTest) -> None:
    name = unique("busy")
    with turnstile.connect(backend.url) as client:
        lock = client.lock(name, 10)
        with lock.acquire(timeout=10), pytest.raises(turnstile.AcquireTimeout):
            lock.acquire(timeout=0.2)
    outcomes = sorted(
        (s.attributes or {})["turnstile.outcome"] for s in spans("turnstile.acquire", name)
    )
    assert outcomes == ["granted", "timeout"]
    by_outcome = {
        p.attributes["turnstile.outcome"]: p for p in points("turnstile.acquire.wait", name)
    }
    assert by_outcome["timeout"].count == 1 and by_outcome["timeout"].sum >= 0.2


def test_lease_lost(backend: BackendUnderTest) -> None:
    name = unique("lost")
    ttl = 0.2
    with turnstile.connect(backend.url) as client:
        lease = client.lock(name, ttl).acquire(timeout=10)  # never renewed: not in a block
        time.sleep(ttl * 1.5)
        assert lease.lost
        lease.release()
    [span] = spans("turnstile.lease.lost", name)
    assert (span.attributes or {})["turnstile.token"] == lease.token
    assert not span.status.is_ok
    [lost] = points("turnstile.leases.lost", name)
    assert lost.value == 1


def test_queue_put_deliver_settle(backend: BackendUnderTest) -> None:
    name = unique("q")
    with turnstile.connect(backend.url) as client:
        q = client.queue(name)
        first = q.put({"n": 1})
        assert q.put({"n": 1}, dedup_id="d") == q.put({"n": 2}, dedup_id="d")
        m = q.get(timeout=10)
        assert m is not None and m.id == first
        assert m.ack()
        m2 = q.get(timeout=10)
        assert m2 is not None
        assert m2.nack()
        m3 = q.get(timeout=10)
        assert m3 is not None and m3.attempt == 2
        assert m3.ack()
    puts = {p.attributes["turnstile.created"]: p.value for p in points("turnstile.queue.put", name)}
    assert puts == {True: 2, False: 1}
    delivered = {
        p.attributes["turnstile.redelivery"]: p.value
        for p in points("turnstile.queue.delivered", name)
    }
    assert delivered == {False: 2, True: 1}
    settled = {
        (p.attributes["turnstile.settlement"], p.attributes["turnstile.accepted"]): p.value
        for p in points("turnstile.queue.settled", name)
    }
    assert settled == {("ack", True): 2, ("nack", True): 1}
    assert len(spans("turnstile.queue.put", name)) == 3
    deliveries = spans("turnstile.queue.deliver", name)
    assert [(s.attributes or {})["turnstile.attempt"] for s in deliveries] == [1, 1, 2]
    assert [
        (s.attributes or {})["turnstile.settlement"] for s in spans("turnstile.queue.settle", name)
    ] == ["ack", "nack", "ack"]


def test_work_handler_runs_inside_a_process_span(backend: BackendUnderTest) -> None:
    name = unique("work")
    tracer = TRACER_PROVIDER.get_tracer("test")
    with turnstile.connect(backend.url) as client:
        q = client.queue(name)
        q.put("job")

        def handler(message: turnstile.Message) -> None:
            with tracer.start_as_current_span("user-work"):
                pass

        result = q.work(handler, max_messages=1, handle_signals=False)
    assert result.acked == 1
    [process] = spans("turnstile.queue.process", name)
    [user] = [s for s in EXPORTER.get_finished_spans() if s.name == "user-work"]
    assert user.parent is not None and process.context is not None
    assert user.parent.span_id == process.context.span_id


async def test_async_flavour_reports_the_same(backend: BackendUnderTest) -> None:
    import asyncio

    name = unique("async")
    client = await turnstile.aio.connect(backend.url)
    try:
        lock = client.lock(name, 10)
        first = await lock.acquire(timeout=10)
        task = asyncio.ensure_future(lock.acquire(timeout=60))
        for _ in range(3000):  # the store is the only place that knows: look until it says so
            if (await client.status(name)).waiters:
                break
            await asyncio.sleep(0.01)
        await first.release()
        second = await task
        await second.release()
    finally:
        await client.close()
    [handovers] = points("turnstile.handovers", name)
    assert handovers.value == 1
    assert len(spans("turnstile.acquire", name)) == 2


def test_no_opentelemetry_means_no_op() -> None:
    """Without the package, the module says so once and every call does nothing."""
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import turnstile\n"
        "from turnstile._core import telemetry as t\n"
        "assert not t.ENABLED\n"
        "assert t.acquire('x', 1) is t._NO_TRACKER\n"
        "with turnstile.connect('memory://') as c:\n"
        "    with c.lock('x').acquire(timeout=1): pass\n"
        "    q = c.queue('q'); q.put(1); m = q.get(timeout=1); assert m.ack()\n"
        "assert t._instruments is None\n"
        "assert 'opentelemetry.trace' not in sys.modules\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_api_without_providers_tracks_nothing_until_one_is_set() -> None:
    """The API installed but no provider set and configure() not called: an acquire or a
    queue operation is not tracked (its reports would go to the API's no-op implementation);
    once the application sets a global provider, tracer or meter, they report to it."""
    code = (
        "import turnstile\n"
        "from opentelemetry import metrics, trace\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
        "InMemorySpanExporter\n"
        "from turnstile._core import telemetry as t\n"
        "assert t.ENABLED\n"
        "assert t.acquire('x', 1) is t._NO_TRACKER\n"
        "with turnstile.connect('memory://') as c:\n"
        "    q = c.queue('q'); q.put(1); assert q.get(timeout=1).ack()\n"
        "    q.put(2); q.work(lambda m: None, max_messages=1, handle_signals=False)\n"
        "assert t._instruments is None  # nothing made, nothing reported\n"
        "reader = InMemoryMetricReader()\n"
        "metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))\n"
        "assert t.acquire('x', 1) is not t._NO_TRACKER\n"
        "exporter = InMemorySpanExporter()\n"
        "provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "trace.set_tracer_provider(provider)\n"
        "with turnstile.connect('memory://') as c:\n"
        "    with c.lock('x').acquire(timeout=1): pass\n"
        "    q = c.queue('q'); q.put(1); assert q.get(timeout=1).ack()\n"
        "assert [s.name for s in exporter.get_finished_spans()] == [\n"
        "    'turnstile.acquire', 'turnstile.queue.put', 'turnstile.queue.deliver',\n"
        "    'turnstile.queue.settle']\n"
        "names = [m.name for rm in reader.get_metrics_data().resource_metrics\n"
        "         for sm in rm.scope_metrics for m in sm.metrics]\n"
        "assert 'turnstile.acquire.wait' in names, names\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_provider_named_in_the_environment_is_listened_to() -> None:
    """The API's variable naming a provider to load (as ``opentelemetry-instrument`` sets
    it): an acquire is tracked although the program set no provider in code."""
    code = (
        "import os\n"
        "from turnstile._core import telemetry as t\n"
        "assert t.acquire('x', 1) is t._NO_TRACKER\n"
        "os.environ['OTEL_PYTHON_TRACER_PROVIDER'] = 'sdk_tracer_provider'\n"
        "t._environment = (float('-inf'), False)  # as a second later\n"
        "assert t.acquire('x', 1) is not t._NO_TRACKER\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    env["OTEL_PYTHON_TRACER_PROVIDER"] = "sdk_tracer_provider"
    result = subprocess.run(
        [sys.executable, "-c", "from turnstile._core import telemetry as t\n"
         "assert t.acquire('x', 1) is not t._NO_TRACKER\nprint('ok')"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert result.returncode == 0, result.stderr


async def test_async_work_handler_runs_inside_a_process_span(backend: BackendUnderTest) -> None:
    name = unique("awork")
    tracer = TRACER_PROVIDER.get_tracer("test")
    client = await turnstile.aio.connect(backend.url)
    try:
        q = client.queue(name)
        await q.put("job")

        async def handler(message: turnstile.aio.Message) -> None:
            with tracer.start_as_current_span("async-user-work"):
                pass

        result = await q.work(handler, max_messages=1, handle_signals=False)
    finally:
        await client.close()
    assert result.acked == 1
    [process] = spans("turnstile.queue.process", name)
    [user] = [s for s in EXPORTER.get_finished_spans() if s.name == "async-user-work"]
    assert user.parent is not None and process.context is not None
    assert user.parent.span_id == process.context.span_id
    assert [
        (s.attributes or {})["turnstile.settlement"] for s in spans("turnstile.queue.settle", name)
    ] == ["ack"]
