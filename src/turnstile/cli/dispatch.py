"""``turnstile dispatch sfn --queue Q --state-machine ARN --max N``: the queue dispatcher.

A long-running consumer of a keyed queue that starts one AWS Step Functions execution per
message, at most N running at a time across every dispatcher of the queue. The work is done by
:class:`turnstile.workflows.dispatcher.Dispatcher`; this module parses options, connects,
turns SIGTERM/SIGINT into a clean stop and errors into exit codes. See docs/workflows.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from .._core import validate
from ..errors import BackendUnavailable, InvalidArgument
from . import _support
from ._support import EXIT_CONFIG, EXIT_OK, EXIT_UNAVAILABLE

EPILOG = """\
examples:
  turnstile dispatch sfn --queue jobs --max 3 \\
      --state-machine arn:aws:states:eu-west-1:123456789012:stateMachine:render
  turnstile --url postgresql://… dispatch sfn --queue jobs --max 10 --state-machine ARN -v

Each message starts one execution named <message id>-<attempt>, with the input
{"payload": <message>, "turnstile": {"queue", "id", "key", "receipt", "attempt"}}. The
message stays in flight while its execution runs: at most --max messages of QUEUE are in
flight across every dispatcher (the store enforces it), one per key. Every --poll seconds
each running execution is described (DescribeExecution): SUCCEEDED acks its message; FAILED,
TIMED_OUT or ABORTED nacks it (again after --backoff * 2^(attempt-1) seconds, a dead letter
after --max-attempts). An execution may settle its own message (the SQS bridge): the
dispatcher then stops tracking it.

A dispatcher that dies leaves its messages in flight for --visibility-timeout; the next
dispatcher adopts an execution still running, acks a message whose execution succeeded, and
starts nothing twice. SIGTERM or SIGINT: start nothing more and exit 0, leaving running
executions in flight (the next dispatcher adopts them).

AWS settings (region, credentials, AWS_ENDPOINT_URL) are the standard ones, as for the AWS
CLI. IAM: states:DescribeStateMachine, states:StartExecution, states:DescribeExecution.

exit codes: 0 stopped by a signal; 2 bad arguments; 69 store or Step Functions unavailable
at start; 78 the state machine cannot be used (missing, EXPRESS, access denied), boto3
missing, or a bad URL.
"""


def register(subparsers: Any) -> None:
    parser = _support.command_parser(
        subparsers,
        "dispatch",
        help="start at most N workflow executions from a queue",
        description=(
            "Consume a keyed queue and start one workflow execution per message, at most N\n"
            "running at a time (per-key order kept). Engines: sfn (AWS Step Functions)."
        ),
    )
    sub = parser.add_subparsers(title="engines", metavar="ENGINE")
    p = _support.command_parser(
        sub,
        "sfn",
        help="AWS Step Functions",
        description=(
            "Start one AWS Step Functions execution per message of --queue, at most --max\n"
            "running at a time across every dispatcher of the queue."
        ),
        epilog=EPILOG,
    )
    p.add_argument(
        "--queue", metavar="NAME", required=True, type=_support.name_type("--queue"),
        help="the keyed queue to consume",
    )
    p.add_argument(
        "--state-machine", metavar="ARN", required=True, type=_arn_type,
        help="the (STANDARD) state machine to start",
    )
    p.add_argument(
        "--max", metavar="N", required=True, type=_support.limit_type("--max"),
        help="at most N executions running at a time (the queue's in-flight cap)",
    )
    p.add_argument(
        "--poll", metavar="SECONDS", type=_support.seconds_type("--poll", 0.01, 3600.0),
        default=2.0,
        help="seconds between two DescribeExecution calls of one running execution (default 2)",
    )
    p.add_argument(
        "--visibility-timeout", metavar="S",
        type=_seconds_type("--visibility-timeout", validate.visibility_timeout),
        default=300.0,
        help="seconds a message stays in flight if this dispatcher dies; extended every "
        "third of it while its execution runs (default 300)",
    )
    p.add_argument(
        "--max-attempts", metavar="N",
        type=_support.int_type("--max-attempts", 1, validate.MAX_ATTEMPTS), default=5,
        help="executions of one message before it is a dead letter (default 5)",
    )
    p.add_argument(
        "--backoff", metavar="S", type=_seconds_type("--backoff", validate.delay), default=1.0,
        help="after a failed execution, deliver again after S * 2^(attempt-1) seconds "
        "(default 1)",
    )
    p.add_argument(
        "--max-backoff", metavar="S", type=_seconds_type("--max-backoff", validate.delay),
        default=60.0, help="longest backoff (default 60)",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="a line on stderr per execution"
    )
    p.set_defaults(handler=sfn_command, dispatch_parser=p)
    parser.set_defaults(handler=lambda args: _usage(sub))


def _usage(sub: Any) -> int:
    _support.error(f"choose an engine: {', '.join(sub.choices)} (see: turnstile dispatch --help)")
    return _support.EXIT_USAGE


def _arn_type(text: str) -> str:
    from ..workflows.dispatcher import check_state_machine_arn

    try:
        return check_state_machine_arn(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds_type(option: str, check: Any) -> Any:
    def parse(text: str) -> float:
        value = _support._parse_float(text, "a number of seconds")
        try:
            return float(check(value, option))
        except InvalidArgument as exc:
            raise _support.type_error(option, exc) from None

    return parse


def sfn_command(args: argparse.Namespace) -> int:
    if args.backoff > args.max_backoff:
        args.dispatch_parser.error(
            f"--backoff ({validate.seconds_text(args.backoff)}) must not be more than "
            f"--max-backoff ({validate.seconds_text(args.max_backoff)})"
        )
    _support.log_to_stderr(logging.INFO if args.verbose else logging.WARNING)
    return asyncio.run(_dispatch(args))


async def _dispatch(args: argparse.Namespace) -> int:
    from .. import aio
    from ..workflows import aws
    from ..workflows.dispatcher import Dispatcher, DispatchError

    aws.boto3_module()  # ConfigurationError (exit 78) naming the extra if boto3 is missing
    client = await aio.connect(_support.given_url(args))
    try:
        if not client.characteristics.cross_process:
            _support.note(
                f"warning: {client.characteristics.scheme}:// is private to this process; "
                "no other process can put messages for this dispatcher"
            )
        dispatcher = Dispatcher(
            client,
            queue=args.queue,
            state_machine_arn=args.state_machine,
            max_running=args.max,
            poll=args.poll,
            visibility_timeout=args.visibility_timeout,
            max_attempts=args.max_attempts,
            backoff=args.backoff,
            max_backoff=args.max_backoff,
        )
        try:
            await dispatcher.check()
        except DispatchError as exc:
            _support.error(str(exc))
            return EXIT_CONFIG
        except BackendUnavailable as exc:
            _support.error(str(exc))
            return EXIT_UNAVAILABLE
        _support.note(
            f"dispatching queue {args.queue!r} to {args.state_machine}, "
            f"at most {args.max} running"
        )
        try:
            result = await dispatcher.run(handle_signals=True)
        except DispatchError as exc:
            _support.error(str(exc))
            return EXIT_CONFIG
    finally:
        await client.close()
    _support.note(
        f"stopped ({result.stopped_by}): {result.started} started, {result.adopted} adopted, "
        f"{result.acked} acked, {result.nacked} nacked, {result.settled_elsewhere} settled "
        f"elsewhere; {dispatcher.running} left in flight"
    )
    return EXIT_OK
