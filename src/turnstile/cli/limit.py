"""``turnstile limit``: change the limit of a name for its next grants."""

from __future__ import annotations

import argparse

from . import _support

EPILOG = """\
examples:
  turnstile limit builds 4        # let 4 hold 'builds' at once from now on
  turnstile limit builds 1 --json

A name has one limit while it has holders or waiters: `turnstile run --semaphore NAME
--limit N` (or any acquire) naming another limit is refused (exit 2) until this command
changes it. Raising the limit grants waiters at once, in line order; lowering it never
revokes a held lease: nobody more is granted until fewer than N hold. An idle name keeps
no state: then nothing changes, and the next acquire sets its limit.
--json prints {"name": …, "limit": N, "previous": the limit replaced or null if idle}.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _support.command_parser(
        subparsers,
        "limit",
        help="change the limit of a name",
        description=(
            "Change how many may hold NAME at once, atomically on the store, for the next\n"
            "grants (a semaphore's limit; a lock is limit 1)."
        ),
        epilog=EPILOG,
    )
    parser.add_argument("name", metavar="NAME", type=_support.name_type("NAME"))
    parser.add_argument("limit", metavar="N", type=_support.limit_type("N"))
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=limit_command)


def limit_command(args: argparse.Namespace) -> int:
    with _support.connect(args) as client:
        previous = client.semaphore(args.name, args.limit).set_limit(args.limit)
    if args.json:
        _support.print_json({"name": args.name, "limit": args.limit, "previous": previous})
        return _support.EXIT_OK
    name = _support.printable(args.name)
    if previous is None:
        print(
            f"{name}: idle (no holders, no waiters), nothing to change; "
            "its next acquire sets its limit"
        )
    elif previous == args.limit:
        print(f"{name}: limit {args.limit} (unchanged)")
    else:
        print(f"{name}: limit {previous} -> {args.limit}")
    return _support.EXIT_OK
