"""``turnstile ask``: join a line with a callback instead of waiting (docs/workflows.md)."""

from __future__ import annotations

import argparse
import sys

from .._core import callbacks
from ..errors import InvalidArgument
from . import _support

EPILOG = """\
examples:
  turnstile ask shared-db --limit 5 --ttl 3600 --holder "$EXECUTION_ARN" --task-token - <token
  turnstile ask order:42 --holder job-7 --callback-url https://jobs.example/turnstile/grant

The grant, now or when this holder's turn comes, is delivered by a deliverer (`turnstile
serve`, `turnstile bridge sqs` or `turnstile deliver` on the same store), at least once:
SendTaskSuccess with the lease as output, or a POST of the lease signed with
$TURNSTILE_CALLBACK_SECRET (header X-Turnstile-Signature: sha256=<hex HMAC of the body>).
The lease is {"name", "holder", "token", "expires_at", "limit"}; release it with
`turnstile release NAME --holder H --token T`. Asking again with the same callback is
harmless. A task token is a credential: pass it on stdin (--task-token -), not as an
argument other users can read in the process list.
--json prints {"acquired": bool, "position": N or null, "token": T or null}.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _support.command_parser(
        subparsers,
        "ask",
        help="join a line with a callback (Step Functions task token or HTTP URL)",
        description=(
            "Ask for NAME on behalf of HOLDER and return at once: the grant is delivered to\n"
            "the callback when HOLDER's turn comes, with no process waiting for it."
        ),
        epilog=EPILOG,
    )
    parser.add_argument("name", metavar="NAME", type=_support.name_type("NAME"))
    parser.add_argument(
        "--holder", required=True, type=_support.holder_type("--holder"), help="who asks"
    )
    parser.add_argument(
        "--limit",
        type=_support.limit_type("--limit"),
        default=1,
        help="how many may hold NAME at once (default 1: a lock)",
    )
    parser.add_argument(
        "--ttl",
        type=_support.ttl_type("--ttl"),
        default=60.0,
        help="seconds the granted lease lasts unless renewed (default 60)",
    )
    parser.add_argument(
        "--wait-ttl",
        type=_support.ttl_type("--wait-ttl"),
        default=callbacks.DEFAULT_WAIT,
        help="seconds the place in line lasts (default 86400: one day)",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--task-token",
        metavar="TOKEN",
        help="a Step Functions task token, or - to read it from stdin",
    )
    target.add_argument("--callback-url", metavar="URL", help="an http(s) URL to POST the lease to")
    _support.add_priority_options(parser, "place in line")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=ask_command)


def _callback(args: argparse.Namespace) -> callbacks.Callback:
    if args.callback_url is not None:
        return callbacks.check(callbacks.HttpCallback(args.callback_url), "--callback-url")
    token = args.task_token
    if token == "-":
        token = sys.stdin.readline().strip()
    try:
        return callbacks.check(callbacks.StepFunctionsCallback(token), "--task-token")
    except InvalidArgument as exc:
        # Never echo the token itself.
        raise InvalidArgument(
            str(exc).replace("--task-token.task_token", "--task-token")
        ) from None


def ask_command(args: argparse.Namespace) -> int:
    callback = _callback(args)
    with _support.connect(args) as client:
        ticket = client.semaphore(
            args.name, args.limit, ttl=args.ttl, priority=args.priority, ageing=args.ageing
        ).try_acquire(args.holder, args.wait_ttl, callback=callback)
    token = ticket.lease.token if ticket.lease is not None else None
    if args.json:
        _support.print_json(
            {"acquired": ticket.acquired, "position": ticket.position, "token": token}
        )
        return _support.EXIT_OK
    name = _support.printable(args.name)
    if ticket.acquired:
        print(f"{name}: granted to {args.holder!r} (token {token}); delivery pending")
    else:
        print(f"{name}: {args.holder!r} waits at position {ticket.position}; delivery on grant")
    return _support.EXIT_OK
