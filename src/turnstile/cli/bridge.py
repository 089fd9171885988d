"""``turnstile bridge sqs QUEUE_URL``: AWS Step Functions executions ask through an SQS queue
and are resumed the moment their turn comes (docs/workflows.md). Needs boto3
(``pip install 'turnstile-locks[aws]'``); registering the command imports none of it."""

from __future__ import annotations

import argparse
import logging

from . import _support

EPILOG = """\
examples:
  turnstile bridge sqs https://sqs.eu-west-1.amazonaws.com/123456789012/turnstile.fifo \\
      --url postgresql://turnstile@db/turnstile
  turnstile bridge sqs "$QUEUE_URL" --no-deliver --reconcile-interval 0

messages (JSON bodies; the ASL sends them with sqs:sendMessage[.waitForTaskToken]):
  {"action": "acquire", "name": N, "limit": 1, "ttl": 30, "holder": H, "task_token": T}
  {"action": "try", …same fields…}          answers at once: {acquired, position, lease}
  {"action": "release", "name": N, "holder": H, "token": K}
  {"action": "ack"|"nack", "queue": Q, "id": I, "receipt": R}
and EventBridge "Step Functions Execution Status Change" events (frees a dead execution).

Grants go in the order the bridge receives the asks: strict on an SQS FIFO queue (the ASL
passes MessageGroupId), best effort on a standard queue. AWS endpoint, region and
credentials come from the usual AWS settings (AWS_REGION, AWS_ENDPOINT_URL, profiles...).
exit codes: 0 stopped by SIGTERM/SIGINT; 2 bad arguments; 69 store or SQS unavailable at
start; 78 configuration (no boto3, queue missing or not allowed, no region/credentials).
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _support.command_parser(
        subparsers,
        "bridge",
        help="let AWS Step Functions wait for permits without polling",
        description=(
            "Bridge a message queue to the store: workflow engines ask for locks and\n"
            "semaphores by sending messages, and are resumed by a callback when granted."
        ),
    )
    transports = parser.add_subparsers(title="transports", metavar="TRANSPORT")
    sqs = _support.command_parser(
        transports,
        "sqs",
        help="receive from an SQS queue; resume Step Functions executions",
        description=(
            "Long-poll an SQS queue for the messages of Step Functions executions, record\n"
            "each on the store (then delete it), and resume each waiting execution with\n"
            "SendTaskSuccess when its turn comes. Also runs a deliverer and a reconciler\n"
            "that frees the permits of executions that ended without releasing."
        ),
        epilog=EPILOG,
    )
    sqs.add_argument("queue_url", metavar="QUEUE_URL", help="the SQS queue URL")
    sqs.add_argument(
        "--no-deliver",
        action="store_true",
        help="run no deliverer here (another `turnstile bridge` or `turnstile serve` does)",
    )
    sqs.add_argument(
        "--reconcile-interval",
        metavar="SECONDS",
        type=_reconcile_type,
        default=10.0,
        help="ask Step Functions about holders that are executions, on names with waiters, "
        "at most this often per holder (default 10; 0 = off)",
    )
    sqs.add_argument(
        "--wait-ttl",
        metavar="SECONDS",
        type=_support.ttl_type("--wait-ttl"),
        default=None,
        help="how long a waiting execution keeps its place when its message gives no "
        "wait_ttl (default one day)",
    )
    sqs.add_argument(
        "--delivery-claim",
        metavar="SECONDS",
        type=_support.seconds_type("--delivery-claim", low=1.0, high=3600.0),
        default=30.0,
        help="a delivery taken by a bridge that dies is taken again after this (default 30)",
    )
    sqs.add_argument("-v", "--verbose", action="store_true", help="log each step at info level")
    sqs.set_defaults(handler=bridge_sqs)
    parser.set_defaults(handler=_choose, bridge_parser=parser)


def _reconcile_type(text: str) -> float:
    value = _support.seconds_type("--reconcile-interval", high=86400.0)(text)
    if 0 < value < 0.1:
        raise argparse.ArgumentTypeError("must be 0 (off) or at least 0.1 seconds")
    return value


def _choose(args: argparse.Namespace) -> int:
    _support.error("choose a transport: sqs (see: turnstile bridge --help)")
    return _support.EXIT_USAGE


def bridge_sqs(args: argparse.Namespace) -> int:
    import asyncio

    _support.log_to_stderr(logging.INFO if args.verbose else logging.WARNING)
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    from .._async.client import connect
    from ..workflows import aws, bridge

    aws.boto3_module()  # no boto3: exit 78 now, naming the extra
    client = await connect(_support.given_url(args))
    try:

        def ready(running: bridge.Bridge) -> None:
            deliverer = "deliverer on" if running.deliverer is not None else "no deliverer here"
            reconciler = (
                f"reconciler every {_support.duration(args.reconcile_interval)}"
                if args.reconcile_interval
                else "no reconciler"
            )
            kind = "FIFO" if running.fifo else "standard (best-effort order)"
            _support.note(
                f"bridge: {args.queue_url} ({kind}) -> {client.url}; {deliverer}, {reconciler}"
            )

        await bridge.serve(
            client,
            args.queue_url,
            on_ready=ready,
            deliver=not args.no_deliver,
            reconcile_interval=args.reconcile_interval,
            wait_ttl=args.wait_ttl,
            claim=args.delivery_claim,
        )
    finally:
        await client.close()
    _support.note("bridge stopped")
    return _support.EXIT_OK
