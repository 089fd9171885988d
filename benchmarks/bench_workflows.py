#!/usr/bin/env python3
"""At most N Step Functions executions at a time: callbacks vs polling vs ListExecutions.

Runs on moto's server, a LOCAL EMULATOR of the AWS APIs whose Step Functions part runs real
ASL; it is not AWS (no network, no service quotas, no throttling, its own scheduling). N
executions start together and each must hold a permit of a semaphore of ``--limit`` while
its work (a Wait of ``--work`` seconds) runs. Contenders, one after the other in one run:

* **callback**: ``examples/stepfunctions/semaphore-callback.asl.json``: the execution asks
  once through ``turnstile bridge sqs`` and waits on its task token; the bridge's deliverer
  resumes it the moment its turn comes (SendTaskSuccess);
* **polling recipe, Wait 1 s / 5 s**: ``polling-recipe.asl.json``: ask (answered at once),
  and if not granted wait and ask again (Turnstile's old recipe);
* **ListExecutions semaphore**: the seed article's answer, no Turnstile: a checker lists the
  state machine's RUNNING executions and lets the oldest N proceed; the others wait 1 s and
  ask again (the checker stands in for the article's Lambda).

Measured from the executions' own histories: the makespan against the ideal (a perfect FIFO
semaphore with no overhead on the same arrivals and work), state transitions per execution
(all, and those of the semaphore part: everything but the work), AWS API calls per
execution (from moto's request recorder), and release -> next execution resumed (p50/p99).
The store behind the bridge is SQLite (the default; the emulator is the cost here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import secrets
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from turnstile_bench.main import Bench, main  # noqa: E402
from turnstile_bench.metrics import percentile  # noqa: E402
from turnstile_bench.plots import Figure  # noqa: E402
from turnstile_bench.report import command_line, machine_lines, markdown_table  # noqa: E402
from turnstile_bench.servers import Unavailable  # noqa: E402

LISTER_ACCESS_KEY_ID = "lister"
WORK_STATES = {"Work", "Do the work"}


def _moto() -> Any:
    from tests.aws import _moto

    return _moto


LIST_EXECUTIONS_ASL = {
    "Comment": "The ListExecutions semaphore: the oldest N RUNNING executions proceed.",
    "StartAt": "Check",
    "States": {
        "Check": {
            "Type": "Task",
            "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
            "Parameters": {
                "QueueUrl": "${CheckerQueueUrl}",
                "MessageBody": {
                    "execution.$": "$$.Execution.Id",
                    "limit.$": "$.limit",
                    "task_token.$": "$$.Task.Token",
                },
            },
            "ResultPath": "$.check",
            "Next": "Proceed?",
        },
        "Proceed?": {
            "Type": "Choice",
            "Choices": [{"Variable": "$.check.proceed", "BooleanEquals": True, "Next": "Work"}],
            "Default": "Wait before checking again",
        },
        "Wait before checking again": {
            "Type": "Wait",
            "SecondsPath": "$.poll_seconds",
            "Next": "Check",
        },
        "Work": {
            "Type": "Parallel",
            "Branches": [
                {
                    "StartAt": "Do the work",
                    "States": {
                        "Do the work": {
                            "Type": "Wait",
                            "SecondsPath": "$.work_seconds",
                            "End": True,
                        }
                    },
                }
            ],
            "ResultPath": None,
            "End": True,
        },
    },
}


class Checker:
    """The ListExecutions semaphore's decider (the article's Lambda): for each check, list
    the state machine's RUNNING executions and answer whether the asker is among the oldest
    ``limit``."""

    def __init__(self, moto: Any, queue_url: str, machine: str) -> None:
        self._sqs = _client(moto, "sqs")
        self._sfn = _client(moto, "stepfunctions")
        self._queue = queue_url
        self._machine = machine
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _running(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"stateMachineArn": self._machine, "statusFilter": "RUNNING"}
        while True:
            page = self._sfn.list_executions(**kwargs)
            found += page["executions"]
            if not page.get("nextToken"):
                return found
            kwargs["nextToken"] = page["nextToken"]

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self._sqs.receive_message(
                QueueUrl=self._queue, MaxNumberOfMessages=10, WaitTimeSeconds=1
            )
            for message in got.get("Messages", []):
                body = json.loads(message["Body"])
                oldest = sorted(self._running(), key=lambda e: e["startDate"])
                allowed = {e["executionArn"] for e in oldest[: int(body["limit"])]}
                self._sfn.send_task_success(
                    taskToken=body["task_token"],
                    output=json.dumps({"proceed": body["execution"] in allowed}),
                )
                self._sqs.delete_message(
                    QueueUrl=self._queue, ReceiptHandle=message["ReceiptHandle"]
                )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _client(moto: Any, service: str) -> Any:
    """A client of the emulator under the checker's own access key (told apart in the
    recording)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        service,
        endpoint_url=moto.endpoint,
        region_name=_moto().REGION,
        aws_access_key_id=LISTER_ACCESS_KEY_ID,
        aws_secret_access_key=_moto().SECRET_ACCESS_KEY,
        config=Config(proxies={}, retries={"total_max_attempts": 1}),
    )


def _ts(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


def read_execution(moto: Any, arn: str) -> dict[str, Any]:
    from tests.aws.bridge_process import history

    events = history(moto, arn)
    out: dict[str, Any] = {"transitions": 0, "semaphore_transitions": 0}
    for e in events:
        kind = e["type"]
        entered = e.get("stateEnteredEventDetails", {}).get("name")
        exited = e.get("stateExitedEventDetails", {}).get("name")
        if kind == "ExecutionStarted":
            out["start"] = _ts(e["timestamp"])
        elif kind.startswith("Execution") and kind != "ExecutionStarted":
            out["end"] = _ts(e["timestamp"])
            out["status"] = kind.removeprefix("Execution").upper()
        if kind.endswith("StateEntered"):
            out["transitions"] += 1
            if entered not in WORK_STATES:
                out["semaphore_transitions"] += 1
            if entered == "Work":
                out["work_start"] = _ts(e["timestamp"])
            if entered == "Release":
                out["released"] = _ts(e["timestamp"])
        if kind.endswith("StateExited") and exited == "Work":
            out["work_end"] = _ts(e["timestamp"])
    out.setdefault("released", out.get("end"))
    out.setdefault("work_start", out.get("end"))
    out.setdefault("work_end", out.get("end"))
    return out


def ideal_makespan(starts: list[float], work: list[float], limit: int) -> float:
    """A perfect FIFO semaphore with no overhead: each arrival, in order, takes the slot
    that frees first."""
    slots = [min(starts)] * limit
    finish = 0.0
    for arrival, seconds in sorted(zip(starts, work, strict=True)):
        slot = min(range(limit), key=lambda i: slots[i])
        begin = max(arrival, slots[slot])
        slots[slot] = begin + seconds
        finish = max(finish, slots[slot])
    return finish - min(starts)


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def resume_latencies(runs: list[dict[str, Any]], limit: int) -> list[float]:
    """Release -> next execution resumed: the k-th start of work (k >= limit) needed the
    (k - limit)-th release; counted when that execution was waiting at the release."""
    starts = sorted(runs, key=lambda r: r["work_start"])
    releases = sorted(r["released"] for r in runs)
    out = []
    for k in range(limit, len(starts)):
        freed = releases[k - limit]
        if starts[k]["start"] < freed:
            out.append(max(0.0, starts[k]["work_start"] - freed))
    return out


class WorkflowsBench(Bench):
    name = "workflows"
    description = __doc__ or ""
    packages = ("moto", "boto3")
    requires = (
        ("moto", "pip install 'moto[server,stepfunctions,sqs]'"),
        ("boto3", "pip install boto3"),
    )
    json_writes_results = True

    def options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--executions", type=int, default=50)
        parser.add_argument("--limit", type=int, default=5)
        parser.add_argument("--work", type=int, default=2, help="whole seconds of work each")

    def target(self, args: argparse.Namespace, info: dict[str, Any]) -> Any:
        @contextlib.contextmanager
        def started() -> Iterator[Any]:
            try:
                moto = _moto().MotoServer()
            except Exception as exc:  # no emulator here: skip, and say why
                raise Unavailable(f"cannot start moto's server: {exc}") from exc
            with moto, tempfile.TemporaryDirectory(dir=args.tmpdir) as folder:
                yield moto, Path(folder)

        return started()

    def _sizes(self, args: argparse.Namespace) -> tuple[int, int, int]:
        if args.quick:
            return 8, 2, 1
        return args.executions, args.limit, args.work

    def run(self, args: argparse.Namespace, target: Any) -> dict[str, Any]:
        moto, folder = target
        executions, limit, work = self._sizes(args)
        contenders: list[tuple[str, str, dict[str, Any]]] = [
            ("callback (turnstile bridge sqs)", "semaphore-callback.asl.json", {}),
            ("polling recipe, Wait 1 s", "polling-recipe.asl.json", {"poll_seconds": 1}),
            ("polling recipe, Wait 5 s", "polling-recipe.asl.json", {"poll_seconds": 5}),
            ("ListExecutions semaphore, Wait 1 s", "", {"poll_seconds": 1}),
        ]
        if args.quick:
            contenders = [c for c in contenders if "5 s" not in c[0]]
        rows = []
        for label, example, extra in contenders:
            print(f"{label}: {executions} executions, limit {limit}", file=sys.stderr)
            rows.append(
                self._one(moto, folder, label, example, extra, executions, limit, work)
            )
        return {
            "command": command_line(self.script, args.argv),
            "executions": executions,
            "limit": limit,
            "work": work,
            "rows": rows,
            "figures": [
                Figure(
                    "makespan",
                    "Makespan against the ideal (lower is better; 1.0 = a perfect semaphore)",
                    "",
                    "makespan / ideal",
                    [r["label"] for r in rows],
                    {"makespan / ideal": [r["makespan_ratio"] for r in rows]},
                ),
                Figure(
                    "resume",
                    "Release -> next execution resumed, p50 (ms, log scale)",
                    "",
                    "ms",
                    [r["label"] for r in rows],
                    {"p50 ms": [r["resume_p50_ms"] for r in rows]},
                    logy=True,
                ),
            ],
        }

    def _one(
        self,
        moto: Any,
        folder: Path,
        label: str,
        example: str,
        extra: dict[str, Any],
        executions: int,
        limit: int,
        work: int,
    ) -> dict[str, Any]:
        from tests.aws import bridge_process as bp

        moto.reset()
        # The bridge's asks keep their order on a FIFO queue; the checker needs no order.
        queue = bp.make_queue(moto, fifo=bool(example), visibility=10)
        store = f"sqlite:///{folder / (secrets.token_hex(4) + '.db')}"
        name = "shared-" + secrets.token_hex(3)
        helper: Any
        if example:
            machine = bp.make_machine(moto, example, queue)
            helper = bp.BridgeProcess(moto, queue, store, "--reconcile-interval", "0")
        else:
            text = json.dumps(LIST_EXECUTIONS_ASL).replace("${CheckerQueueUrl}", queue)
            machine = moto.client("stepfunctions").create_state_machine(
                name="list-executions-" + secrets.token_hex(3),
                definition=text,
                roleArn=_moto().ROLE_ARN,
            )["stateMachineArn"]
            helper = Checker(moto, queue, machine)
        try:
            time.sleep(1.0)  # the bridge's first long poll is under way
            moto.start_recording()
            data = {"name": name, "limit": limit, "work_seconds": work, **extra}
            arns = [
                bp.start(moto, machine, f"run-{i:03d}-{secrets.token_hex(2)}", data)
                for i in range(executions)
            ]
            timeout = 120 + executions * work * 3
            finished = bp.wait_finished(moto, arns, timeout)
            moto.stop_recording()
            entries = moto.recording()
        finally:
            helper.stop()
        runs = [read_execution(moto, arn) for arn in arns]
        ok = sum(1 for s in finished.values() if s == "SUCCEEDED")
        by_key: Counter[str] = Counter()
        for entry in entries:
            headers = {str(k).lower(): str(v) for k, v in entry.get("headers", {}).items()}
            auth = headers.get("authorization", "")
            who = (
                "interpreter"
                if f"Credential={_moto().INTERPRETER_ACCESS_KEY_ID}/" in auth
                else "bridge"
                if f"Credential={bp.BRIDGE_ACCESS_KEY_ID}/" in auth
                else "checker"
                if f"Credential={LISTER_ACCESS_KEY_ID}/" in auth
                else "driver"
            )
            if who != "driver":  # the benchmark's own StartExecution / DescribeExecution
                by_key[f"{who}:{_moto().action_of(entry)}"] += 1
        starts = [r["start"] for r in runs]
        durations = [r["work_end"] - r["work_start"] for r in runs]
        makespan = max(r["released"] for r in runs) - min(starts)
        ideal = ideal_makespan(starts, durations, limit)
        resumes = resume_latencies(runs, limit)
        calls = sum(by_key.values())
        semaphore = [r["semaphore_transitions"] for r in runs]
        return {
            "label": label,
            "succeeded": ok,
            "executions": executions,
            "max_working": max_overlap([(r["work_start"], r["work_end"]) for r in runs]),
            "makespan_s": makespan,
            "ideal_s": ideal,
            "makespan_ratio": makespan / ideal if ideal else math.nan,
            "transitions_mean": sum(r["transitions"] for r in runs) / len(runs),
            "semaphore_transitions_mean": sum(semaphore) / len(runs),
            "semaphore_transitions_max": max(semaphore),
            "aws_calls_per_execution": calls / executions,
            "calls": dict(sorted(by_key.items())),
            "resume_p50_ms": percentile(resumes, 50) * 1000 if resumes else math.nan,
            "resume_p99_ms": percentile(resumes, 99) * 1000 if resumes else math.nan,
            "resumes": len(resumes),
        }

    def markdown(
        self, results: dict[str, Any], args: argparse.Namespace, info: dict[str, Any]
    ) -> str:
        rows = results["rows"]
        table = [
            [
                r["label"],
                f"{r['succeeded']}/{r['executions']}",
                r["max_working"],
                r["makespan_s"],
                r["ideal_s"],
                r["makespan_ratio"],
                r["semaphore_transitions_mean"],
                r["semaphore_transitions_max"],
                r["transitions_mean"],
                r["aws_calls_per_execution"],
                r["resume_p50_ms"],
                r["resume_p99_ms"],
            ]
            for r in rows
        ]
        calls = [
            [r["label"], ", ".join(f"{k} {v}" for k, v in r["calls"].items())] for r in rows
        ]
        callback = rows[0]
        lines = [
            "# Step Functions: at most N executions at a time",
            "",
            *machine_lines(info, results["command"]),
            "- AWS: **moto's server, a local emulator of the AWS APIs** (its Step Functions "
            "part runs the real ASL); not AWS. Absolute times are the emulator's and this "
            "shared machine's: compare rows of one run.",
            f"- {results['executions']} executions started together, semaphore limit "
            f"{results['limit']}, work {results['work']} s each (a Wait state); the bridge's "
            "store is SQLite.",
            "",
            "## Results",
            "",
            markdown_table(
                [
                    "contender",
                    "succeeded",
                    "max working at once",
                    "makespan s",
                    "ideal s",
                    "makespan / ideal",
                    "semaphore transitions / execution (mean)",
                    "(max)",
                    "all transitions / execution",
                    "AWS calls / execution",
                    "release -> resumed p50 ms",
                    "p99 ms",
                ],
                table,
            ),
            "",
            "*ideal*: a perfect FIFO semaphore with no overhead on the same arrivals and work. "
            "*semaphore transitions*: state transitions of everything but the work (Step "
            "Functions bills Standard workflows per transition). *AWS calls*: every request of "
            "the executions' own tasks (the interpreter's SQS SendMessage), the bridge and the "
            "checker, over the number of executions (the benchmark's own StartExecution and "
            "history reads are left out). *max working at once* over `limit` means the "
            "contender let more than its limit run.",
            "",
            "## Against the targets",
            "",
            f"- makespan within 10% of the ideal: {callback['makespan_ratio']:.3f}x "
            f"({'met' if callback['makespan_ratio'] <= 1.10 else 'not met'})",
            f"- at most 4 transitions per execution for the semaphore part: "
            f"{callback['semaphore_transitions_max']} "
            f"({'met' if callback['semaphore_transitions_max'] <= 4 else 'not met'})",
            f"- resume p50 at most 100 ms: {callback['resume_p50_ms']:.1f} ms "
            f"({'met' if callback['resume_p50_ms'] <= 100 else 'not met'})",
            "",
            "## AWS calls by caller and action",
            "",
            markdown_table(["contender", "calls"], calls),
        ]
        return "\n".join(lines) + "\n"

    def sane(self, results: dict[str, Any]) -> bool:
        rows = results["rows"]
        turnstile_rows = [r for r in rows if "ListExecutions" not in r["label"]]
        return all(r["succeeded"] == r["executions"] for r in rows) and all(
            r["max_working"] <= results["limit"] for r in turnstile_rows
        )


if __name__ == "__main__":
    sys.exit(main(WorkflowsBench()))
