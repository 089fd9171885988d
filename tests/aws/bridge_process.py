"""Helpers for the SQS bridge tests, which run against moto's server: a LOCAL EMULATOR of the
AWS APIs (SQS, Step Functions with its ASL interpreter), not AWS. The bridge runs as a real
``python -m turnstile bridge sqs …`` process pointed at the emulator by ``MotoServer.env()``."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.aws._moto import ROLE_ARN, MotoServer, action_of
from tests.cli._invoke import default_signals

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "stepfunctions"
BRIDGE_ACCESS_KEY_ID = "bridge"


def bridge_calls(moto: MotoServer) -> Counter[str]:
    """The AWS actions the bridge process called (signed with its own access key) since
    ``moto.start_recording()``."""
    counts: Counter[str] = Counter()
    for entry in moto.recording():
        headers = {str(k).lower(): str(v) for k, v in entry.get("headers", {}).items()}
        if f"Credential={BRIDGE_ACCESS_KEY_ID}/" in headers.get("authorization", ""):
            counts[action_of(entry)] += 1
    return counts


def wait_until(predicate: Any, timeout: float, interval: float = 0.05, what: str = "") -> Any:
    """Poll ``predicate`` (bounded) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what or predicate}")
        time.sleep(interval)


class BridgeProcess:
    """``python -m turnstile bridge sqs QUEUE_URL --url STORE …`` against the emulator."""

    def __init__(self, moto: MotoServer, queue_url: str, store_url: str, *args: str) -> None:
        self.moto = moto
        self.command = [
            sys.executable,
            "-m",
            "turnstile",
            "bridge",
            "sqs",
            queue_url,
            "--url",
            store_url,
            "--verbose",
            *args,
        ]
        self.log_path = Path(tempfile.gettempdir()) / f"bridge-{secrets.token_hex(4)}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        env = dict(os.environ)
        env.update(self.moto.env())
        env["PYTHONPATH"] = str(ROOT / "src")
        # Its own (dummy) access key, so the recorder tells its calls from the test's.
        env["AWS_ACCESS_KEY_ID"] = BRIDGE_ACCESS_KEY_ID
        env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=default_signals,  # SIGINT/SIGTERM as from a terminal
            )

    def kill(self) -> None:
        """``kill -9``: no clean-up of any kind."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return process.returncode if process else 0
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"the bridge ignored SIGTERM; its log:\n{self.log()}") from None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def make_queue(moto: MotoServer, *, fifo: bool = True, visibility: int = 3) -> str:
    sqs = moto.client("sqs")
    name = f"bridge-{secrets.token_hex(4)}"
    attributes = {"VisibilityTimeout": str(visibility)}
    if fifo:
        name += ".fifo"
        attributes.update(FifoQueue="true", ContentBasedDeduplication="true")
    return str(sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])


def make_machine(moto: MotoServer, example: str, queue_url: str) -> str:
    text = (EXAMPLES / example).read_text().replace("${BridgeQueueUrl}", queue_url)
    json.loads(text)  # still JSON after the substitution
    sfn = moto.client("stepfunctions")
    name = example.split(".")[0] + "-" + secrets.token_hex(3)
    return str(
        sfn.create_state_machine(name=name, definition=text, roleArn=ROLE_ARN)["stateMachineArn"]
    )


def start(moto: MotoServer, machine: str, name: str, data: dict[str, Any]) -> str:
    sfn = moto.client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=machine, name=name, input=json.dumps(data))
    return str(arn["executionArn"])


def statuses(moto: MotoServer, arns: list[str]) -> dict[str, str]:
    sfn = moto.client("stepfunctions")
    return {arn: sfn.describe_execution(executionArn=arn)["status"] for arn in arns}


def wait_finished(moto: MotoServer, arns: list[str], timeout: float) -> dict[str, str]:
    found: dict[str, str] = {}

    def done() -> bool:
        found.update(statuses(moto, [a for a in arns if found.get(a, "RUNNING") == "RUNNING"]))
        return all(s != "RUNNING" for s in found.values())

    wait_until(done, timeout, 0.2, "every execution finished")
    return found


def history(moto: MotoServer, arn: str) -> list[dict[str, Any]]:
    sfn = moto.client("stepfunctions")
    events: list[dict[str, Any]] = []
    token = None
    while True:
        kwargs: dict[str, Any] = {"executionArn": arn, "maxResults": 1000}
        if token:
            kwargs["nextToken"] = token
        page = sfn.get_execution_history(**kwargs)
        events.extend(page["events"])
        token = page.get("nextToken")
        if not token:
            return events


@dataclass
class Run:
    """What one execution's own history says about its lease."""

    arn: str
    asked_from: datetime  # Acquire's TaskScheduled: before its message was sent
    asked_by: datetime  # Acquire's TaskSubmitted: after it was sent
    granted: datetime  # Acquire's TaskStateExited
    released: datetime | None  # Release's TaskStateEntered
    lease: dict[str, Any]
    transitions: int
    holder_tokens: list[int]  # every lease this execution was resumed with

    @property
    def interval(self) -> dict[str, Any]:
        end = self.released or datetime.max.replace(tzinfo=self.granted.tzinfo)
        return {"start": self.granted, "end": end, "token": self.lease["token"]}


def read_run(moto: MotoServer, arn: str, acquire: str = "Acquire") -> Run:
    events = history(moto, arn)
    asked_from = asked_by = granted = released = None
    lease: dict[str, Any] = {}
    tokens: list[int] = []
    in_acquire = False
    for event in events:
        kind = event["type"]
        entered = event.get("stateEnteredEventDetails", {}).get("name")
        exited = event.get("stateExitedEventDetails", {}).get("name")
        if kind == "TaskStateEntered" and entered == acquire:
            in_acquire = True
        elif in_acquire and kind == "TaskScheduled" and asked_from is None:
            asked_from = event["timestamp"]
        elif in_acquire and kind == "TaskSubmitted" and asked_by is None:
            asked_by = event["timestamp"]
        elif in_acquire and kind == "TaskSucceeded":
            output = json.loads(event["taskSucceededEventDetails"]["output"])
            found = output.get("lease") or output
            if isinstance(found, dict) and "token" in found:
                lease = found
                tokens.append(found["token"])
        elif kind == "TaskStateExited" and exited == acquire:
            in_acquire = False
            granted = event["timestamp"]
        elif kind == "TaskStateEntered" and entered == "Release" and released is None:
            released = event["timestamp"]
    transitions = sum(1 for e in events if e["type"].endswith("StateEntered"))
    assert asked_from and asked_by and granted, f"{arn}: {[e['type'] for e in events]}"
    return Run(arn, asked_from, asked_by, granted, released, lease, transitions, tokens)


def check_grant_order(runs: list[Run]) -> None:
    """Grants (lease tokens) follow the order the executions asked. An ask happened at some
    instant in [TaskScheduled, TaskSubmitted] of its execution (the message was sent between
    the two, ms resolution): if j's ask was over before i's began, j asked first and must
    hold the smaller token. Asks that overlap, or tie at the ms, may go either way."""
    by_token = sorted(runs, key=lambda r: r.lease["token"])
    for position, earlier in enumerate(by_token):
        for later in by_token[position + 1 :]:
            assert not later.asked_by < earlier.asked_from, (
                f"{later.arn} asked (by {later.asked_by}) before {earlier.arn} "
                f"(from {earlier.asked_from}) yet was granted after it"
            )
