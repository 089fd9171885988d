"""Step Functions deliveries against moto's server (a local emulator of the AWS APIs, not
AWS): what each answer of ``SendTaskSuccess`` does to the grant (issue 16 point 2).

* a refused task token (``InvalidToken``: the execution is gone or the token is not one)
  releases the grant, scoped by its token, and the next in line is granted at once;
* a refusal on a *repeated* attempt (an earlier deliverer may have sent it, then died before
  settling) is delivered when the execution still runs, refused when it does not exist.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import turnstile
import turnstile.aio
from tests.aws._moto import ROLE_ARN, MotoServer
from turnstile import StepFunctionsCallback
from turnstile.workflows import aws
from turnstile.workflows.deliverer import Deliverer

EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:machine:{}"


@pytest.fixture
def on_moto(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoServer]:
    for key, value in moto.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    aws.forget_clients()
    try:
        yield moto
    finally:
        aws.forget_clients()


def _running_execution(moto: MotoServer) -> str:
    sfn = moto.client("stepfunctions")
    machine = sfn.create_state_machine(
        name="waits-" + secrets.token_hex(3),
        definition=json.dumps(
            {"StartAt": "W", "States": {"W": {"Type": "Wait", "Seconds": 60, "End": True}}}
        ),
        roleArn=ROLE_ARN,
    )["stateMachineArn"]
    name = "run-" + secrets.token_hex(3)
    return str(
        sfn.start_execution(stateMachineArn=machine, name=name, input="{}")["executionArn"]
    )


async def test_a_refused_token_releases_the_grant_and_serves_the_next(
    on_moto: MotoServer, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'sfn.db'}"
    client = await turnstile.aio.connect(url)
    try:
        sem = client.semaphore("db", 1, ttl=60)
        gone = EXECUTION.format("gone")
        first = await sem.try_acquire(gone, callback=StepFunctionsCallback("not-a-real-token"))
        assert first.acquired and first.lease is not None
        got: list[turnstile.Lease] = []
        sync = turnstile.connect(url)
        waiter = threading.Thread(
            target=lambda: got.append(
                sync.semaphore("db", 1, ttl=60).acquire(timeout=30, holder="next")
            )
        )
        waiter.start()
        deliverer = Deliverer(client.backend)
        assert await deliverer.round() == 1
        assert deliverer.stats.refused == 1 and deliverer.stats.delivered == 0
        waiter.join(30)
        assert got and got[0].holder == "next" and got[0].token > first.lease.token
        got[0].release()
        sync.close()
    finally:
        await client.close()


async def test_a_repeated_attempt_is_judged_by_the_execution(
    on_moto: MotoServer, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'sfn.db'}"
    client = await turnstile.aio.connect(url)
    running = _running_execution(on_moto)
    try:
        backend = client.backend
        for holder, name in ((running, "alive"), (EXECUTION.format("never-was"), "dead")):
            sem = client.semaphore(name, 1, ttl=60)
            await sem.try_acquire(holder, callback=StepFunctionsCallback("spent-" + name))
        # A first deliverer takes both, sends (say), and dies before settling: its claims
        # lapse and the next deliverer's attempt is the second.
        first: Any = await backend.take_deliveries(lease=1.0, max_count=10)
        assert len(first) == 2
        deliverer = Deliverer(client.backend)
        await _until_taken(deliverer, 2)
        by_name = {
            name: (await client.status(name)).holders for name in ("alive", "dead")
        }
        # Still running: the spent token was evidently used by the first attempt.
        assert [(h.holder, h.delivery) for h in by_name["alive"]] == [(running, "delivered")]
        # Never existed: refused, the grant released.
        assert by_name["dead"] == ()
    finally:
        on_moto.client("stepfunctions").stop_execution(executionArn=running)
        await client.close()


async def _until_taken(deliverer: Deliverer, count: int) -> None:
    import asyncio

    taken = 0
    for _ in range(200):
        taken += await deliverer.round()
        if taken >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"only {taken} of {count} deliveries were taken again")
