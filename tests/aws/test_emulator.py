"""The moto fixture works: moto (a local emulator of the AWS APIs, not AWS) runs a state
machine whose ``sqs:sendMessage.waitForTaskToken`` task is resumed by ``SendTaskSuccess``."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.aws._moto import ROLE_ARN, MotoServer


def _definition(queue_url: str) -> str:
    return json.dumps(
        {
            "StartAt": "Wait for token",
            "States": {
                "Wait for token": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                    "Parameters": {
                        "QueueUrl": queue_url,
                        "MessageBody": {
                            "task_token.$": "$$.Task.Token",
                            "holder.$": "$$.Execution.Id",
                        },
                    },
                    "ResultPath": "$.granted",
                    "TimeoutSeconds": 60,
                    "Next": "Done",
                },
                "Done": {"Type": "Pass", "End": True},
            },
        }
    )


def _wait_until_finished(sfn: Any, execution_arn: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        described: dict[str, Any] = sfn.describe_execution(executionArn=execution_arn)
        if described["status"] != "RUNNING" or time.monotonic() > deadline:
            return described
        time.sleep(0.02)


def test_send_task_success_resumes_a_wait_for_task_token_task(moto: MotoServer) -> None:
    sqs, sfn = moto.client("sqs"), moto.client("stepfunctions")
    queue_url = sqs.create_queue(QueueName="tokens")["QueueUrl"]
    machine = sfn.create_state_machine(
        name="callback", definition=_definition(queue_url), roleArn=ROLE_ARN
    )["stateMachineArn"]

    moto.start_recording()
    execution_arn = sfn.start_execution(
        stateMachineArn=machine, name="first", input=json.dumps({"job": 7})
    )["executionArn"]
    assert execution_arn.endswith(":execution:callback:first")

    messages = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=5)["Messages"]
    body = json.loads(messages[0]["Body"])
    assert body["holder"] == execution_arn
    assert sfn.describe_execution(executionArn=execution_arn)["status"] == "RUNNING"

    sfn.send_task_success(taskToken=body["task_token"], output=json.dumps({"lease": 1}))
    described = _wait_until_finished(sfn, execution_arn)
    moto.stop_recording()

    assert described["status"] == "SUCCEEDED", moto.log()[-2000:]
    assert json.loads(described["output"]) == {"job": 7, "granted": {"lease": 1}}
    events = sfn.get_execution_history(executionArn=execution_arn)["events"]
    types = [event["type"] for event in events]
    resumed = types.index("TaskSucceeded")
    assert types[resumed - 1] == "TaskSubmitted"  # the message was sent, then it waited
    assert types[resumed + 1 :] == [
        "TaskStateExited",
        "PassStateEntered",
        "PassStateExited",
        "ExecutionSucceeded",
    ]
    assert json.loads(events[resumed]["taskSucceededEventDetails"]["output"]) == {"lease": 1}

    calls = moto.calls()
    assert calls["StartExecution"] == 1
    assert calls["SendTaskSuccess"] == 1
    assert calls["ReceiveMessage"] == 1
    assert "SendMessage" not in calls  # the interpreter's own call, counted only on request
    assert moto.calls(interpreter=True)["SendMessage"] == 1
