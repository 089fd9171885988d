"""``turnstile dispatch sfn``: at most N Step Functions executions from a keyed queue, against
moto's server (a LOCAL EMULATOR of the AWS APIs, not AWS) running the real target ASL of
``examples/stepfunctions/dispatcher-target.asl.json``.

What is shown from the executions' own histories: never more than N running at once; per key,
executions in put order, never overlapping; failed executions nacked and retried, one that
always fails a dead letter; a dispatcher killed with ``kill -9`` and restarted starts no
message twice. From moto's request recorder: the dispatcher never calls ListExecutions, and
its DescribeExecution calls are bounded by (running executions x polls) + the look-ups of
redelivered messages. (The emulator's Wait state takes whole seconds, as AWS does.)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import turnstile.aio
from tests.aws._moto import ROLE_ARN, MotoServer, missing
from tests.backends import BACKENDS, BackendRow
from tests.cli._invoke import default_signals
from turnstile.workflows import aws
from turnstile.workflows.dispatcher import Dispatcher, execution_arn, execution_name

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "examples" / "stepfunctions" / "dispatcher-target.asl.json"
MAX = 3
POLL = 0.25
KEYS = 6
MESSAGES = 60
FAIL_ONCE = {7, 22}  # fail on attempt 1, succeed on attempt 2
FAIL_ALWAYS = 13  # a dead letter after --max-attempts 3


def _stores() -> list[Any]:
    wanted = {"sqlite", "redis", "postgres"}
    return [
        pytest.param(row, id=row.name, marks=getattr(pytest.mark, row.name))
        for row in BACKENDS
        if row.name in wanted
    ]


@pytest.fixture(params=_stores())
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A private URL on SQLite, and on Redis/PostgreSQL when their test servers are named."""
    row: BackendRow = request.param
    server = row.server_url()
    if server is None:
        missing(f"{row.env} is not set (scripts/dev.py test starts a server and sets it)")
    uid = secrets.token_hex(5)
    try:
        yield row.make_url(server, uid, tmp_path)
    finally:
        row.cleanup(server, uid)


def _machine(moto: MotoServer, name: str = "target") -> str:
    sfn = moto.client("stepfunctions")
    arn: str = sfn.create_state_machine(
        name=name, definition=TARGET.read_text(), roleArn=ROLE_ARN
    )["stateMachineArn"]
    return arn


def _payload(i: int) -> dict[str, Any]:
    payload: dict[str, Any] = {"n": i, "seconds": 1 if i % 3 == 0 else 0}
    if i in FAIL_ONCE:
        payload["fail_first"] = True
    if i == FAIL_ALWAYS:
        payload["fail"] = True
    return payload


def _id(i: int) -> str:
    return f"m{i:02d}"


async def _put_all(url: str, queue: str) -> None:
    async with await turnstile.aio.connect(url) as client:
        q = client.queue(queue, max_attempts=3)
        for i in range(MESSAGES):
            await q.put_message(_payload(i), key=f"k{i % KEYS}", id=_id(i))


async def _stats(url: str, queue: str) -> Any:
    async with await turnstile.aio.connect(url) as client:
        return await client.queue(queue).stats()


async def _dead(url: str, queue: str) -> list[Any]:
    async with await turnstile.aio.connect(url) as client:
        return await client.queue(queue).dead_letters()


async def _wait_drained(
    url: str, queue: str, timeout: float = 120.0, explain: Callable[[], str] = str
) -> None:
    """Until nothing is ready, delayed or in flight; on time-out the failure shows the stats
    and ``explain()`` (what the dispatcher and the emulator say)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = await _stats(url, queue)
        if stats.ready == stats.delayed == stats.in_flight == 0:
            return
        assert time.monotonic() < deadline, f"{stats}\n{explain()}"
        await asyncio.sleep(0.2)


def _still_running(moto: MotoServer, machine: str) -> str:
    """The executions the emulator reports as RUNNING, with their start times."""
    sfn = moto.client("stepfunctions")
    running = sfn.list_executions(stateMachineArn=machine, statusFilter="RUNNING")
    return "RUNNING in the emulator: " + ", ".join(
        f"{e['name']} (since {e['startDate']})" for e in running["executions"]
    )


@dataclass
class Run:
    """One execution, from its history."""

    name: str
    index: int  # the message's put index
    attempt: int
    start: float
    stop: float
    status: str


def _audit(moto: MotoServer, machine: str) -> list[Run]:
    """Every execution of ``machine`` (ListExecutions: the TEST may, the dispatcher never)
    with its start and end from GetExecutionHistory."""
    sfn = moto.client("stepfunctions")
    runs = []
    for page in sfn.get_paginator("list_executions").paginate(stateMachineArn=machine):
        for execution in page["executions"]:
            events = sfn.get_execution_history(executionArn=execution["executionArn"])["events"]
            assert events[0]["type"] == "ExecutionStarted"
            assert events[-1]["type"] in ("ExecutionSucceeded", "ExecutionFailed"), events[-1]
            name = execution["name"]
            ident, attempt = name.rsplit("-", 1)
            runs.append(
                Run(
                    name,
                    int(ident[1:]),
                    int(attempt),
                    events[0]["timestamp"].timestamp(),
                    events[-1]["timestamp"].timestamp(),
                    execution["status"],
                )
            )
    return runs


def _most_at_once(runs: list[Run]) -> int:
    edges = sorted([(r.start, 1) for r in runs] + [(r.stop, -1) for r in runs])
    most = current = 0
    for _, step in edges:  # at one instant an end counts before a start
        current += step
        most = max(most, current)
    return most


def _check_runs(runs: list[Run]) -> None:
    names = Counter(r.name for r in runs)
    assert max(names.values()) == 1
    per_message: dict[int, list[Run]] = defaultdict(list)
    for r in sorted(runs, key=lambda r: r.attempt):
        per_message[r.index].append(r)
    assert set(per_message) == set(range(MESSAGES))
    # No message started twice: one execution per message, plus one per failed execution.
    # (The attempt numbers may skip one: a dispatcher killed between a claim and its start
    # leaves that attempt without an execution.)
    for i, executions in per_message.items():
        statuses = [r.status for r in executions]
        if i == FAIL_ALWAYS:
            assert 1 <= len(statuses) <= 3 and set(statuses) == {"FAILED"}, executions
        elif i in FAIL_ONCE:
            assert statuses == ["FAILED", "SUCCEEDED"], executions
            assert executions[0].attempt == 1, executions
        else:
            assert statuses == ["SUCCEEDED"], executions
        assert all(r.name == execution_name(_id(i), r.attempt) for r in executions)
        assert all(r.attempt <= 3 for r in executions)
    assert _most_at_once(runs) <= MAX
    assert _most_at_once(runs) == MAX  # the cap was used, not just respected
    by_key: dict[int, list[Run]] = defaultdict(list)
    for r in sorted(runs, key=lambda r: r.start):
        by_key[r.index % KEYS].append(r)
    for key, ordered in by_key.items():
        indexes = [(r.index, r.attempt) for r in ordered]
        assert indexes == sorted(indexes), (key, indexes)  # put order, retries in place
        for before, after in itertools.pairwise(ordered):
            assert after.start >= before.stop, (key, before, after)  # never overlapping


def _describe_bound(runs: list[Run], redeliveries: int) -> int:
    """Polls of each running execution (one per poll interval, plus the first and the one
    that sees it ended), and up to two look-ups per earlier attempt of a redelivered one."""
    polls = sum(int((r.stop - r.start) / POLL) + 3 for r in runs)
    return polls + 4 * redeliveries


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")) if p
    )
    return env


def _dispatcher(
    moto: MotoServer, url: str, queue: str, machine: str, log: Path, vt: float = 2.0
) -> subprocess.Popen[bytes]:
    env = _env()
    env.update(moto.env())
    command = [
        sys.executable, "-m", "turnstile", "--url", url, "dispatch", "sfn",
        "--queue", queue, "--state-machine", machine, "--max", str(MAX),
        "--poll", str(POLL), "--visibility-timeout", str(vt), "--max-attempts", "3",
        "--backoff", "0.2", "--max-backoff", "0.5", "-v",
    ]  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=default_signals
        )


def _started(log: Path) -> int:
    return log.read_text(errors="replace").count(": started ")


async def test_sixty_messages_three_at_a_time_through_a_kill_9(
    moto: MotoServer, store: str, tmp_path: Path
) -> None:
    machine = _machine(moto)
    queue = "jobs"
    await _put_all(store, queue)
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"

    moto.start_recording()
    first = _dispatcher(moto, store, queue, machine, first_log)
    try:
        deadline = time.monotonic() + 60
        while _started(first_log) < 20:  # mid-run: a third of the messages started
            assert first.poll() is None, first_log.read_text()
            assert time.monotonic() < deadline, first_log.read_text()
            await asyncio.sleep(0.05)
        first.kill()  # kill -9: its messages stay in flight until their visibility passes
        first.wait()
        assert first.returncode == -signal.SIGKILL
        in_flight = (await _stats(store, queue)).in_flight
        assert in_flight >= 1  # the next dispatcher has messages of the dead one to look at
        second = _dispatcher(moto, store, queue, machine, second_log)
        try:
            await _wait_drained(
                store, queue,
                explain=lambda: _still_running(moto, machine) + "\nsecond dispatcher:\n"
                + second_log.read_text(errors="replace")[-3000:],
            )
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=30) == 0, second_log.read_text()
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    moto.stop_recording()
    calls = moto.calls()
    text = second_log.read_text()
    assert "stopped (SIGTERM)" in text, text
    # The dead dispatcher's messages came back (attempt 2) and the next one looked for the
    # executions of their earlier attempts by name before starting anything.
    assert text.count("looking for the executions of attempts") >= in_flight, text

    assert "ListExecutions" not in calls
    runs = _audit(moto, machine)  # the test's own ListExecutions, after the recording
    _check_runs(runs)
    failed = sum(r.status == "FAILED" for r in runs)
    assert calls["StartExecution"] == len(runs)  # every start started one, no repeats
    assert calls["DescribeExecution"] <= _describe_bound(runs, failed + in_flight), calls
    assert calls["DescribeStateMachine"] == 2  # one check per dispatcher start

    dead = await _dead(store, queue)
    assert [d.id for d in dead] == [_id(FAIL_ALWAYS)]  # every other message acked
    assert dead[0].attempts == 3
    assert dead[0].error is not None and "FAILED" in dead[0].error, dead[0].error
    assert "TargetFailed" in dead[0].error


async def test_a_running_execution_is_adopted_not_restarted(
    moto: MotoServer, tmp_path: Path
) -> None:
    """A dispatcher stopped (or dead) while an execution runs leaves its message in flight;
    once the visibility timeout passes the next dispatcher adopts the running execution."""
    machine = _machine(moto)
    url = f"sqlite:///{tmp_path}/adopt.db"
    sfn = moto.client("stepfunctions")
    async with await turnstile.aio.connect(url) as client:
        q = client.queue("long")
        await q.put_message({"seconds": 3}, key="a", id="long-job")
        await q.put_message({"seconds": 0}, key="a", id="next-job")
        options: dict[str, Any] = dict(
            queue="long", state_machine_arn=machine, max_running=2, poll=0.2,
            visibility_timeout=0.6, sfn=sfn,
        )  # fmt: skip
        first = Dispatcher(client, **options)
        task = asyncio.create_task(first.run())
        arn = execution_arn(machine, execution_name("long-job", 1))
        await _until(lambda: first.result.started == 1)
        first.stop()  # SIGTERM does this: nothing new starts, the running one stays
        result = await task
        assert (result.started, result.acked, first.running) == (1, 0, 1)
        assert sfn.describe_execution(executionArn=arn)["status"] == "RUNNING"

        moto.start_recording()
        second = Dispatcher(client, **options)
        task = asyncio.create_task(second.run())
        await _until(lambda: second.result.acked == 2, timeout=20)
        second.stop()
        result = await task
        moto.stop_recording()
        assert result.adopted == 1 and result.started == 1  # only next-job was started
        assert sfn.describe_execution(executionArn=arn)["status"] == "SUCCEEDED"
        names = {e["name"] for e in sfn.list_executions(stateMachineArn=machine)["executions"]}
        assert names == {"long-job-1", "next-job-1"}  # long-job ran once
        calls = moto.calls()
        assert calls["StartExecution"] == 1 and "ListExecutions" not in calls
        stats = await q.stats()
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)


async def test_an_execution_that_settles_its_own_message_is_no_longer_tracked(
    moto: MotoServer, tmp_path: Path
) -> None:
    """The SQS bridge lets an execution ack its message with the receipt from its input: the
    dispatcher sees its extend or ack refused and lets the message go."""
    machine = _machine(moto)
    url = f"sqlite:///{tmp_path}/self.db"
    sfn = moto.client("stepfunctions")
    async with await turnstile.aio.connect(url) as client:
        q = client.queue("self")
        await q.put_message({"seconds": 1}, key="a", id="selfish")
        dispatcher = Dispatcher(
            client, queue="self", state_machine_arn=machine, max_running=1, poll=0.2,
            visibility_timeout=0.6, sfn=sfn,
        )  # fmt: skip
        task = asyncio.create_task(dispatcher.run())
        await _until(lambda: dispatcher.result.started == 1)
        arn = execution_arn(machine, execution_name("selfish", 1))
        given = json.loads(sfn.describe_execution(executionArn=arn)["input"])
        assert given["payload"] == {"seconds": 1}
        meta = given["turnstile"]
        assert (meta["queue"], meta["id"], meta["key"], meta["attempt"]) == (
            "self", "selfish", "a", 1,
        )  # fmt: skip
        assert await q.ack(meta["id"], meta["receipt"])  # what the bridge does
        await _until(lambda: dispatcher.result.settled_elsewhere == 1)
        dispatcher.stop()
        result = await task
        assert (result.acked, result.nacked, dispatcher.running) == (0, 0, 0)


class _Throttled:
    """A Step Functions client whose first calls of each action are throttled, as AWS does
    under load (``ThrottlingException``): the dispatcher must retry, never drop."""

    def __init__(self, sfn: Any, failures: int) -> None:
        self._sfn = sfn
        self._left: Counter[str] = Counter(
            {"start_execution": failures, "describe_execution": failures}
        )
        self.throttled = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._sfn, name)

        def call(**kwargs: Any) -> Any:
            if self._left[name] > 0:
                self._left[name] -= 1
                self.throttled += 1
                from botocore.exceptions import ClientError  # type: ignore[import-untyped]

                error = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}
                raise ClientError(error, name)
            return method(**kwargs)

        return call


async def test_throttling_is_retried_and_no_message_dropped(
    moto: MotoServer, tmp_path: Path
) -> None:
    machine = _machine(moto)
    url = f"sqlite:///{tmp_path}/throttled.db"
    sfn = _Throttled(moto.client("stepfunctions"), failures=3)
    async with await turnstile.aio.connect(url) as client:
        q = client.queue("busy")
        for i in range(4):
            await q.put_message({"seconds": 0}, key=f"k{i % 2}", id=f"t{i}")
        dispatcher = Dispatcher(
            client, queue="busy", state_machine_arn=machine, max_running=2, poll=0.1, sfn=sfn
        )
        task = asyncio.create_task(dispatcher.run())
        await _until(lambda: dispatcher.result.acked == 4, timeout=30)
        dispatcher.stop()
        result = await task
        assert sfn.throttled == 6
        assert (result.started, result.nacked) == (4, 0)  # each started once, none failed
        names = {e["name"] for e in moto.client("stepfunctions").list_executions(
            stateMachineArn=machine)["executions"]}  # fmt: skip
        assert names == {f"t{i}-1" for i in range(4)}
        stats = await q.stats()
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)


def test_a_missing_state_machine_exits_78_before_consuming(
    moto: MotoServer, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/missing.db"
    asyncio.run(_put_one(url))
    missing = "arn:aws:states:us-east-1:123456789012:stateMachine:nope"
    env = _env()
    env.update(moto.env())
    moto.start_recording()
    out = subprocess.run(
        [sys.executable, "-m", "turnstile", "--url", url, "dispatch", "sfn",
         "--queue", "q", "--state-machine", missing, "--max", "2"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    moto.stop_recording()
    assert out.returncode == 78, out.stderr
    assert "StateMachineDoesNotExist" in out.stderr and "Traceback" not in out.stderr
    assert set(moto.calls()) == {"DescribeStateMachine"}
    stats = asyncio.run(_stats(url, "q"))
    assert (stats.ready, stats.in_flight) == (1, 0)  # nothing consumed


async def _put_one(url: str) -> None:
    async with await turnstile.aio.connect(url) as client:
        await client.queue("q").put({"seconds": 0}, key="a")


async def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_execution_names_are_valid_deterministic_and_distinct() -> None:
    import re

    valid = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
    ids = ["m01", "a-1", "a", "x" * 64, "x" * 65, "ünïcode id", "a/b", "a b", "a_b"]
    ids.append("abc--" + "0" * 24)  # looks like a hashed name: hashed too
    names = set()
    for message_id in ids:
        for attempt in (1, 2, 1000):
            for generation in (1, 2):
                name = execution_name(message_id, attempt, generation)
                assert valid.match(name), name
                assert name == execution_name(message_id, attempt, generation)
                names.add(name)
    assert len(names) == len(ids) * 3 * 2
    assert execution_name("m01", 2) == "m01-2"
    arn = "arn:aws:states:us-east-1:123456789012:stateMachine:target"
    expected = "arn:aws:states:us-east-1:123456789012:execution:target:m01-2"
    assert execution_arn(arn, "m01-2") == expected


@pytest.fixture(autouse=True)
def _fresh_aws_clients() -> Iterator[None]:
    aws.forget_clients()
    yield
    aws.forget_clients()
