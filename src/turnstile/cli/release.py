"""``turnstile release``: release a holder's lease, or its place in line, from anywhere."""

from __future__ import annotations

import argparse

from . import _support

EPILOG = """\
examples:
  turnstile release shared-db --holder "$EXECUTION_ARN" --token 1795603289494363
  turnstile release order:42 --holder job-7        # its lease and its place in line

With --token only that grant is released: a stale release never frees a newer grant of the
same holder. Without it, the holder's lease and its place in line both go. Releasing twice
is harmless. Exit 0 either way; --json prints {"released": bool}.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _support.command_parser(
        subparsers,
        "release",
        help="release a holder's lease or place in line",
        description="Release HOLDER's lease on NAME (or, without --token, also its place).",
        epilog=EPILOG,
    )
    parser.add_argument("name", metavar="NAME", type=_support.name_type("NAME"))
    parser.add_argument("--holder", required=True, type=_support.holder_type("--holder"))
    parser.add_argument(
        "--token",
        type=_support.int_type("--token", 1, 2**63 - 1),
        default=None,
        help="the fencing token of the lease to release",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=release_command)


def release_command(args: argparse.Namespace) -> int:
    with _support.connect(args) as client:
        released = client.semaphore(args.name, 1).release(args.holder, args.token)
    if args.json:
        _support.print_json({"released": released})
    else:
        name = _support.printable(args.name)
        print(f"{name}: {'released' if released else 'nothing to release'} ({args.holder!r})")
    return _support.EXIT_OK
