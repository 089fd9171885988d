"""The SQS bridge and the ASL examples of examples/stepfunctions/, end to end.

Everything AWS here is moto's server: a LOCAL EMULATOR of the AWS APIs (SQS and Step
Functions with its interpreter of real ASL), not AWS. The bridge runs as a real
``python -m turnstile bridge sqs`` process; the facts checked come from the executions' own
histories (TaskStateExited of Acquire = granted, TaskStateEntered of Release = released).

Stores: SQLite always; the Redis and PostgreSQL rows of tests/backends.py when
TURNSTILE_TEST_REDIS_URL / TURNSTILE_TEST_POSTGRES_URL are set and that store has callback
grants (skipped otherwise).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import turnstile
import turnstile.aio
from tests.aws._moto import MotoServer, missing
from tests.aws.bridge_process import (
    BridgeProcess,
    bridge_calls,
    check_grant_order,
    make_machine,
    make_queue,
    read_run,
    start,
    statuses,
    wait_finished,
    wait_until,
)
from tests.backends import BACKENDS
from tests.contract.lock_harness import max_concurrency

ROWS = [r for r in BACKENDS if r.name in ("sqlite", "redis", "postgres")]


@pytest.fixture(params=[pytest.param(r, id=r.name) for r in ROWS])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL private to this test (tests/backends.py rows)."""
    row = request.param
    server = row.server_url()
    if server is None:
        missing(f"{row.env} is not set (scripts/dev.py test starts a server and sets it)")
    uid = secrets.token_hex(5)
    url = row.make_url(server, uid, tmp_path)
    try:
        yield url
    finally:
        row.cleanup(server, uid)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/bridge.db"


@pytest.fixture
def bridges() -> Iterator[list[BridgeProcess]]:
    started: list[BridgeProcess] = []
    yield started
    for bridge in started:
        bridge.stop()


def _bridge(
    bridges: list[BridgeProcess], moto: MotoServer, queue: str, store: str, *args: str
) -> BridgeProcess:
    bridge = BridgeProcess(moto, queue, store, *args)
    bridges.append(bridge)
    return bridge


def _finish(moto: MotoServer, arns: list[str], timeout: float, bridge: BridgeProcess) -> None:
    try:
        found = wait_finished(moto, arns, timeout)
    except AssertionError:
        raise AssertionError(f"not finished; bridge log:\n{bridge.log()[-3000:]}") from None
    failed = {a: s for a, s in found.items() if s != "SUCCEEDED"}
    assert not failed, f"{failed}\nbridge log:\n{bridge.log()[-3000:]}"


def _holders(store: str, name: str) -> list[str]:
    with turnstile.connect(store) as client:
        return [h.holder for h in client.status(name).holders]


@pytest.mark.timeout(120)
def test_semaphore_50_executions_limit_5(
    moto: MotoServer, store: str, bridges: list[BridgeProcess]
) -> None:
    queue = make_queue(moto)
    machine = make_machine(moto, "semaphore-callback.asl.json", queue)
    bridge = _bridge(bridges, moto, queue, store, "--reconcile-interval", "0")
    data = {"name": "reports", "limit": 5, "work_seconds": 1}

    alone = start(moto, machine, "alone", data)
    _finish(moto, [alone], 30, bridge)
    lone = read_run(moto, alone)

    began = time.monotonic()
    arns = [start(moto, machine, f"run-{i:02d}", data) for i in range(50)]
    _finish(moto, arns, 90, bridge)
    took = time.monotonic() - began
    runs = [read_run(moto, arn) for arn in arns]

    assert max_concurrency([r.interval for r in runs]) <= 5
    assert max_concurrency([r.interval for r in runs]) >= 2  # they did run side by side
    assert len({r.lease["token"] for r in runs}) == 50
    assert all(r.holder_tokens == [r.lease["token"]] for r in runs)  # resumed once each
    check_grant_order(runs)
    # No polling: the same state transitions whether an execution waited or not.
    assert {r.transitions for r in runs} == {lone.transitions}
    assert _holders(store, "reports") == []
    print(f"50 executions, limit 5, 1 s of work each: {took:.1f} s")


@pytest.mark.timeout(120)
def test_a_standard_queue_works_too(
    moto: MotoServer, sqlite_store: str, bridges: list[BridgeProcess]
) -> None:
    """A standard (not FIFO) SQS queue: asks are best effort in order (SQS may reorder
    messages sent close together), but safety, fencing and delivery hold the same."""
    queue = make_queue(moto, fifo=False)
    machine = make_machine(moto, "semaphore-callback.asl.json", queue)
    bridge = _bridge(bridges, moto, queue, sqlite_store, "--reconcile-interval", "0")
    data = {"name": "standard", "limit": 2, "work_seconds": 1}
    arns = [start(moto, machine, f"std-{i:02d}", data) for i in range(10)]
    _finish(moto, arns, 60, bridge)
    runs = [read_run(moto, arn) for arn in arns]
    assert max_concurrency([r.interval for r in runs]) <= 2
    assert len({r.lease["token"] for r in runs}) == 10
    assert all(r.holder_tokens == [r.lease["token"]] for r in runs)
    assert _holders(sqlite_store, "standard") == []


@pytest.mark.timeout(120)
def test_lock_per_entity_order(moto: MotoServer, store: str, bridges: list[BridgeProcess]) -> None:
    queue = make_queue(moto)
    machine = make_machine(moto, "lock-callback.asl.json", queue)
    bridge = _bridge(bridges, moto, queue, store, "--reconcile-interval", "0")
    arns: dict[str, list[str]] = {}
    for event in range(5):
        for order in ("A", "B", "C"):
            arn = start(moto, machine, f"{order}-{event}", {"order_id": order, "work_seconds": 1})
            arns.setdefault(order, []).append(arn)
    _finish(moto, [a for group in arns.values() for a in group], 90, bridge)
    spans = []
    for order, group in arns.items():
        runs = [read_run(moto, arn) for arn in group]
        assert {r.lease["name"] for r in runs} == {f"order:{order}"}
        assert max_concurrency([r.interval for r in runs]) == 1
        check_grant_order(runs)
        spans.append((min(r.granted for r in runs), max(r.released for r in runs if r.released)))
    # Other orders ran meanwhile: the three spans overlap.
    assert max(s for s, _ in spans) < min(e for _, e in spans)


@pytest.mark.timeout(120)
def test_polling_recipe_runs_and_costs_transitions(
    moto: MotoServer, store: str, bridges: list[BridgeProcess]
) -> None:
    queue = make_queue(moto)
    machine = make_machine(moto, "polling-recipe.asl.json", queue)
    bridge = _bridge(bridges, moto, queue, store, "--reconcile-interval", "0")
    data = {"name": "reports", "limit": 2, "work_seconds": 2, "poll_seconds": 1}
    arns = [start(moto, machine, f"poll-{i}", data) for i in range(6)]
    _finish(moto, arns, 90, bridge)
    runs = [read_run(moto, arn, acquire="Ask") for arn in arns]
    # Each asked until a ticket said acquired, and holds the lease that ticket carried.
    assert all(len(r.holder_tokens) == 1 for r in runs), [r.holder_tokens for r in runs]
    intervals = [
        {"start": _last_exit(moto, r.arn, "Ask"), "end": r.released, "token": r.lease["token"]}
        for r in runs
    ]
    assert max_concurrency(intervals) <= 2
    # Those that waited paid for it in state transitions; the callback ASL never does.
    assert max(r.transitions for r in runs) > min(r.transitions for r in runs)


def _last_exit(moto: MotoServer, arn: str, state: str) -> datetime:
    from tests.aws.bridge_process import history

    exits = [
        e["timestamp"]
        for e in history(moto, arn)
        if e.get("stateExitedEventDetails", {}).get("name") == state
    ]
    return exits[-1]


def _status_change(arn: str, status: str) -> str:
    """The event EventBridge puts on the queue when an execution changes status (the
    emulator sends none: built here as AWS documents it)."""
    machine = arn.replace(":execution:", ":stateMachine:").rsplit(":", 1)[0]
    now_ms = int(time.time() * 1000)
    return json.dumps(
        {
            "version": "0",
            "id": secrets.token_hex(16),
            "detail-type": "Step Functions Execution Status Change",
            "source": "aws.states",
            "account": arn.split(":")[4],
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": arn.split(":")[3],
            "resources": [arn],
            "detail": {
                "executionArn": arn,
                "stateMachineArn": machine,
                "name": arn.rsplit(":", 1)[1],
                "status": status,
                "startDate": now_ms - 5000,
                "stopDate": now_ms,
                "input": "{}",
                "output": None,
            },
        }
    )


def _hold_and_wait(moto: MotoServer, store: str, machine: str) -> tuple[list[str], list[str]]:
    """5 executions holding 'jobs' (limit 5) for a minute, then 5 waiting behind them."""
    holding = [
        start(moto, machine, f"holder-{i}", {"name": "jobs", "limit": 5, "work_seconds": 60})
        for i in range(5)
    ]
    wait_until(lambda: len(_holders(store, "jobs")) == 5, 30, what="5 holders")
    wait_until(lambda: all(_in_work(moto, a) for a in holding), 30, what="holders in their Work")
    waiting = [
        start(moto, machine, f"waiter-{i}", {"name": "jobs", "limit": 5, "work_seconds": 1})
        for i in range(5)
    ]
    with turnstile.connect(store) as client:
        wait_until(lambda: len(client.status("jobs").waiters) == 5, 30, what="5 waiters")
    return holding, waiting


def _in_work(moto: MotoServer, arn: str) -> bool:
    from tests.aws.bridge_process import history

    return any(
        e.get("stateEnteredEventDetails", {}).get("name") == "Do the work"
        for e in history(moto, arn)
    )


def _stop(moto: MotoServer, arns: list[str]) -> None:
    sfn = moto.client("stepfunctions")
    for arn in arns:
        sfn.stop_execution(executionArn=arn, error="Test.Stopped", cause="stopped by the test")
    wait_until(
        lambda: set(statuses(moto, arns).values()) == {"ABORTED"}, 10, what="executions aborted"
    )


@pytest.mark.timeout(120)
def test_stopped_holders_freed_by_status_change_events(
    moto: MotoServer, store: str, bridges: list[BridgeProcess]
) -> None:
    queue = make_queue(moto)
    machine = make_machine(moto, "semaphore-callback.asl.json", queue)
    bridge = _bridge(bridges, moto, queue, store, "--reconcile-interval", "0")
    holding, waiting = _hold_and_wait(moto, store, machine)

    _stop(moto, holding)
    sqs = moto.client("sqs")
    stopped = time.monotonic()
    for arn in holding:
        sqs.send_message(
            QueueUrl=queue, MessageBody=_status_change(arn, "ABORTED"), MessageGroupId="events"
        )
    wait_until(
        lambda: not set(holding) & set(_holders(store, "jobs")), 2, what="permits back"
    )
    freed_in = time.monotonic() - stopped
    _finish(moto, waiting, 30, bridge)
    print(f"5 stopped holders freed {freed_in:.2f} s after their events were sent")


@pytest.mark.timeout(120)
def test_stopped_holders_freed_by_the_reconciler(
    moto: MotoServer, store: str, bridges: list[BridgeProcess]
) -> None:
    queue = make_queue(moto)
    machine = make_machine(moto, "semaphore-callback.asl.json", queue)
    bridge = _bridge(bridges, moto, queue, store, "--reconcile-interval", "1")

    # Nobody waits: the reconciler asks AWS nothing (two intervals and more, recorded).
    moto.start_recording()
    holding = [
        start(moto, machine, f"alone-{i}", {"name": "jobs", "limit": 5, "work_seconds": 3})
        for i in range(3)
    ]
    _finish(moto, holding, 30, bridge)
    moto.stop_recording()
    assert bridge_calls(moto)["DescribeExecution"] == 0
    assert bridge_calls(moto)["SendTaskSuccess"] == 3

    holding, waiting = _hold_and_wait(moto, store, machine)
    moto.start_recording()
    recorded_from = stopped = time.monotonic()
    _stop(moto, holding)
    wait_until(
        lambda: not set(holding) & set(_holders(store, "jobs")), 15, what="permits back"
    )
    freed_in = time.monotonic() - stopped
    _finish(moto, waiting, 30, bridge)
    moto.stop_recording()
    described = bridge_calls(moto)["DescribeExecution"]
    assert described >= 5
    # At most one call per holder per interval: holders that are executions (at most
    # `limit` = 5 at a time) times the intervals the recording spanned, plus one round.
    intervals = (time.monotonic() - recorded_from) / 1.0
    assert described <= 5 * (intervals + 1), (described, intervals)
    print(f"5 stopped holders freed {freed_in:.2f} s after the stop; {described} DescribeExecution")


@pytest.mark.timeout(180)
def test_bridge_killed_and_restarted_loses_nothing_grants_nothing_twice(
    moto: MotoServer, store: str, bridges: list[BridgeProcess]
) -> None:
    queue = make_queue(moto, visibility=2)
    machine = make_machine(moto, "semaphore-callback.asl.json", queue)
    args = ("--reconcile-interval", "2", "--delivery-claim", "2")
    bridge = _bridge(bridges, moto, queue, store, *args)
    data = {"name": "builds", "limit": 3, "work_seconds": 1}
    arns = [start(moto, machine, f"run-{i:02d}", data) for i in range(30)]

    def succeeded() -> int:
        return sum(1 for s in statuses(moto, arns).values() if s == "SUCCEEDED")

    for kill_after in (6, 15):
        wait_until(lambda n=kill_after: succeeded() >= n, 60, 0.1, f"{kill_after} done")
        bridge.kill()
        bridge.start()
    _finish(moto, arns, 120, bridge)
    runs = [read_run(moto, arn) for arn in arns]
    assert max_concurrency([r.interval for r in runs]) <= 3
    tokens = [t for r in runs for t in r.holder_tokens]
    assert len(tokens) == len(set(tokens)) == 30  # no token delivered to two executions
    assert all(len(r.holder_tokens) == 1 for r in runs)
    assert _holders(store, "builds") == []


@pytest.mark.timeout(120)
def test_bad_messages_never_stop_the_bridge(
    moto: MotoServer, sqlite_store: str, bridges: list[BridgeProcess]
) -> None:
    queue = make_queue(moto)
    machine = make_machine(moto, "semaphore-callback.asl.json", queue)
    bridge = _bridge(bridges, moto, queue, sqlite_store, "--reconcile-interval", "0")
    sqs = moto.client("sqs")
    for body in ("not json", "[]", '{"action": "fly"}', '{"action": "release", "name": "x"}'):
        sqs.send_message(QueueUrl=queue, MessageBody=body, MessageGroupId="junk")
    # A bad ask with a task token fails its execution at once, naming the field.
    bad = start(moto, machine, "bad", {"name": "jobs", "limit": "five", "work_seconds": 0})
    good = start(moto, machine, "good", {"name": "jobs", "limit": 2, "work_seconds": 0})
    _finish(moto, [good], 30, bridge)
    assert wait_finished(moto, [bad], 30)[bad] == "FAILED"
    sfn = moto.client("stepfunctions")
    failed = [
        e
        for e in sfn.get_execution_history(executionArn=bad)["events"]
        if e["type"] == "TaskFailed"
    ]
    assert failed[0]["taskFailedEventDetails"]["error"] == "turnstile.InvalidArgument"

    def empty() -> bool:
        attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])
        counts = attributes["Attributes"]
        return counts["ApproximateNumberOfMessages"] == "0" and (
            counts["ApproximateNumberOfMessagesNotVisible"] == "0"
        )

    wait_until(empty, 10, 0.1, "every message deleted")
    log = bridge.log()
    assert "dropped a bad message" in log and "Traceback" not in log
    assert bridge.process is not None and bridge.process.poll() is None
    assert bridge.stop() == 0


@pytest.mark.timeout(60)
def test_ack_and_nack_of_turnstile_queue_messages(
    moto: MotoServer, sqlite_store: str, bridges: list[BridgeProcess]
) -> None:
    queue = make_queue(moto, fifo=False)
    _bridge(bridges, moto, queue, sqlite_store, "--reconcile-interval", "0")
    with turnstile.connect(sqlite_store) as client:
        jobs = client.queue("jobs", visibility_timeout=60)
        jobs.put({"n": 1}, key="a")
        jobs.put({"n": 2}, key="b")
        first, second = jobs.get(timeout=1), jobs.get(timeout=1)
        assert first is not None and second is not None
        sqs = moto.client("sqs")
        for action, message in (("ack", first), ("nack", second)):
            body: dict[str, Any] = {
                "action": action,
                "queue": "jobs",
                "id": message.id,
                "receipt": message.receipt,
            }
            if action == "nack":
                body.update(error="boom", delay=0)
            sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(body))
        again = wait_until(lambda: jobs.get(timeout=0.2), 15, what="the nacked message back")
        assert again.payload == {"n": 2} and again.attempt == 2
        assert jobs.stats().in_flight == 1


def test_environment_is_the_emulator(moto: MotoServer) -> None:
    """Guard: these tests talk to moto (a local emulator), never to AWS."""
    assert moto.env()["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert "AWS_ENDPOINT_URL" not in os.environ or os.environ["AWS_ENDPOINT_URL"].startswith(
        "http://127.0.0.1"
    )


@pytest.mark.timeout(60)
def test_store_unavailable_keeps_the_message_for_redelivery(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: a message the store could not record is not deleted; SQS delivers it
    again after the visibility timeout, and then it is recorded and deleted."""
    import asyncio

    from turnstile.errors import BackendUnavailable
    from turnstile.workflows import aws
    from turnstile.workflows.bridge import Bridge

    for key, value in moto.env().items():
        monkeypatch.setenv(key, value)
    aws.forget_clients()
    queue = make_queue(moto, visibility=1)
    sqs = moto.client("sqs")
    body = {"action": "release", "name": "jobs", "holder": "someone"}
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(body), MessageGroupId="jobs")

    async def scenario() -> tuple[int, int, int]:
        client = await turnstile.aio.connect("memory://")
        bridge = Bridge(client, queue, deliver=False, reconcile_interval=0, wait_seconds=5)
        real = client.semaphore

        def down(*args: Any, **kwargs: Any) -> Any:
            raise BackendUnavailable("the test took the store away")

        monkeypatch.setattr(client, "semaphore", down)
        kept = await bridge.process(bridge._receive())
        monkeypatch.setattr(client, "semaphore", real)
        again = bridge._receive()  # back after the visibility timeout (1 s)
        while not again:
            again = bridge._receive()
        kept_again = await bridge.process(again)
        await client.close()
        return kept, kept_again, bridge.stats.deleted

    try:
        kept, kept_again, deleted = asyncio.run(scenario())
    finally:
        aws.forget_clients()
    assert (kept, kept_again, deleted) == (1, 0, 1)


def _cli(moto: MotoServer, *args: str) -> Any:
    import subprocess
    import sys

    from tests.aws.bridge_process import ROOT

    env = {**os.environ, **moto.env(), "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "turnstile", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_usage_and_configuration_errors(moto: MotoServer, sqlite_store: str) -> None:
    bare = _cli(moto, "bridge")
    assert bare.returncode == 2
    assert (
        bare.stderr == "turnstile: error: choose a transport: sqs (see: turnstile bridge --help)\n"
    )
    interval = _cli(moto, "bridge", "sqs", "https://q", "--reconcile-interval", "0.01")
    assert interval.returncode == 2 and "0 (off) or at least 0.1 seconds" in interval.stderr
    helped = _cli(moto, "bridge", "sqs", "--help")
    assert helped.returncode == 0 and '"action": "acquire"' in helped.stdout
    missing = f"{moto.endpoint}/123456789012/no-such-queue"
    gone = _cli(moto, "bridge", "sqs", missing, "--url", sqlite_store)
    assert gone.returncode == 78, gone.stderr
    assert gone.stderr.startswith("turnstile: error: cannot use queue ")
    assert "Traceback" not in gone.stderr and gone.stderr.count("\n") == 1
