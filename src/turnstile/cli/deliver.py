"""``turnstile deliver``: run a deliverer of callback grants alone (docs/workflows.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from . import _support

EPILOG = """\
examples:
  TURNSTILE_CALLBACK_SECRET=… turnstile deliver --url redis://localhost:6379/0

`turnstile serve` and `turnstile bridge sqs` run a deliverer already; run this where neither
runs, or for more deliverers: any number may run on one store, each delivery is claimed by
one at a time and a deliverer killed mid-delivery loses nothing (its claim lapses, another
delivers). Step Functions deliveries use the standard AWS settings (AWS_DEFAULT_REGION,
AWS_ENDPOINT_URL, profiles…; pip install 'turnstile-locks[aws]'); HTTP deliveries are signed
with $TURNSTILE_CALLBACK_SECRET. Stops on SIGTERM/SIGINT (exit 0).
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _support.command_parser(
        subparsers,
        "deliver",
        help="deliver callback grants (Step Functions task tokens, signed HTTP POSTs)",
        description=(
            "Deliver the grants of callback waiters on the store, at least once, until\n"
            "stopped: SendTaskSuccess for Step Functions task tokens, a signed POST for URLs."
        ),
        epilog=EPILOG,
    )
    parser.add_argument(
        "--interval",
        type=_support.seconds_type("--interval", low=0.001, high=60.0),
        default=0.05,
        help="seconds between looks when idle (default 0.05)",
    )
    parser.add_argument(
        "--claim",
        type=_support.seconds_type("--claim", low=1.0, high=3600.0),
        default=30.0,
        help="seconds a delivery stays claimed by this deliverer (default 30)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every delivery")
    parser.set_defaults(handler=deliver_command)


def deliver_command(args: argparse.Namespace) -> int:
    _support.log_to_stderr(logging.DEBUG if args.verbose else logging.INFO)
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    from .. import aio
    from ..workflows.deliverer import Deliverer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(signum) != signal.SIG_IGN:
            loop.add_signal_handler(signum, stop.set)
    client = await aio.connect(_support.given_url(args))
    try:
        deliverer = Deliverer(client.backend, interval=args.interval, claim=args.claim)
        async with deliverer:
            _support.note(f"delivering callback grants on {client.url}")
            await stop.wait()
        stats = deliverer.stats
        _support.note(
            f"stopped: {stats.delivered} delivered, {stats.refused} refused, "
            f"{stats.retried} retried"
        )
    finally:
        await client.close()
    return _support.EXIT_OK
