"""The ``turnstile`` command line (also ``python -m turnstile``).

Each command lives in its own module under ``turnstile.cli`` and exposes
``register(subparsers)``, which adds its parser (via :func:`._support.command_parser`, so it
takes ``--url``) and sets ``handler=`` to a function ``(args) -> exit code``. To add a
command, write such a module and list it in :data:`COMMANDS`. ``register`` must stay cheap:
import optional dependencies inside the handler.

Errors end as one line on stderr and an exit code from :mod:`._support` (documented in
docs/cli.md): never a traceback, never a password.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence

from .. import __version__
from ..errors import (
    AcquireTimeout,
    BackendUnavailable,
    ConfigurationError,
    InvalidArgument,
    LeaseLost,
    LimitConflict,
    TurnstileError,
)
from . import _support
from ._support import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_LEASE_LOST,
    EXIT_SIGNAL_BASE,
    EXIT_SOFTWARE,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Terminated,
)

__all__ = ["COMMANDS", "build_parser", "main"]

# Modules under turnstile.cli, in the order `turnstile --help` lists them.
COMMANDS: tuple[str, ...] = (
    "run",
    "status",
    "limit",
    "ask",
    "release",
    "deliver",
    "demo",
    "queue",
    "dispatch",
    "serve",
    "bridge",
    "migrate",
)

DESCRIPTION = """\
Fair leased locks and semaphores shared by every process that uses the same store URL.

  turnstile run --lock NAME -- CMD…             run CMD holding a lock (like flock)
  turnstile run --semaphore NAME --limit N -- CMD…
  turnstile status [NAME] [--json]             holders and waiters
  turnstile demo                               the per-order webhook problem, live
  turnstile queue {queue_actions} …
                                               keyed FIFO queues (turnstile queue --help)
  turnstile dispatch sfn --queue Q --state-machine ARN --max N
                                               at most N Step Functions executions from Q
  turnstile serve [--host H] [--port P]        HTTP API, dashboard, metrics (docs/http.md)
  turnstile bridge sqs QUEUE_URL               Step Functions wait for permits without polling
  turnstile limit NAME N                       change the limit of a name (its next grants)
  turnstile ask NAME --holder H --task-token -  join a line with a callback (no waiting)
  turnstile release NAME --holder H [--token T] release a lease or a place in line
  turnstile deliver                            deliver callback grants (docs/workflows.md)
  turnstile migrate [--print-sql | --apply]    schema version; SQL for a DBA (PostgreSQL)
"""

EPILOG = """\
store: --url, else $TURNSTILE_URL, else one SQLite file per user and host:
  {default}
exit codes: 0 ok; 2 bad arguments; 69 store unavailable; 75 timed out waiting;
78 configuration (bad or empty URL, missing driver, not a database); 79 lease lost while
CMD ran; run passes CMD's own exit code through. See docs/cli.md.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _support.ArgumentParser(
        prog="turnstile",
        description=DESCRIPTION,
        epilog=EPILOG.format(default=_support.default_store()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"turnstile {__version__}")
    _support.add_url_option(parser)
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module_name in COMMANDS:
        module = importlib.import_module(f"{__name__}.{module_name}")
        module.register(subparsers)
    # Every queue action, as registered (a new one shows up here by itself).
    parser.description = DESCRIPTION.format(
        queue_actions="|".join(_subcommands(subparsers.choices["queue"]))
    )
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def _limit_conflict_text(args: argparse.Namespace, exc: LimitConflict) -> str:
    """A refused limit in the command's own words (its flags and `turnstile limit`)."""
    name = getattr(args, "lock", None) or getattr(args, "semaphore", None)
    if exc.current is None or exc.asked is None or not name:
        return str(exc)
    flag = "--lock (limit 1)" if getattr(args, "lock", None) else f"--limit {exc.asked}"
    return (
        f"{name!r} has limit {exc.current} while it has holders or waiters, and {flag} asks "
        f"for another. A name has one limit: use --semaphore {name!r} --limit {exc.current}, "
        f"or change it with: turnstile limit {name!r} {exc.asked}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    _support.quiet_library_logs()
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on bad arguments, 0 after --help/--version
    handler: _support.Handler | None = getattr(args, "handler", None)
    if handler is None:
        _support.error(f"choose a command: {', '.join(COMMANDS)} (see: turnstile --help)")
        return EXIT_USAGE
    secrets = _support.secrets_of(_support.given_url(args)) + _support.env_url_secrets()
    _support.set_secrets(secrets)
    try:
        return handler(args)
    except LimitConflict as exc:
        _support.error(_limit_conflict_text(args, exc), secrets)
        return EXIT_USAGE
    except InvalidArgument as exc:
        _support.error(str(exc), secrets)
        return EXIT_USAGE
    except ConfigurationError as exc:
        _support.error(str(exc), secrets)
        return EXIT_CONFIG
    except BackendUnavailable as exc:
        _support.error(f"store unavailable: {exc}", secrets)
        return EXIT_UNAVAILABLE
    except AcquireTimeout as exc:
        _support.error(str(exc), secrets)
        return EXIT_TIMEOUT
    except LeaseLost as exc:
        _support.error(str(exc), secrets)
        return EXIT_LEASE_LOST
    except TurnstileError as exc:
        _support.error(str(exc), secrets)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(file=sys.stderr)
        _support.note("interrupted")
        return EXIT_SIGNAL_BASE + signal.SIGINT
    except Terminated as exc:
        _support.note(f"stopped by {signal.Signals(exc.signum).name}")
        return EXIT_SIGNAL_BASE + exc.signum
    except BrokenPipeError:
        # The reader went away (`turnstile status | head`): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILURE
    except Exception as exc:  # never a traceback: one line, and a code that says "bug"
        if os.environ.get("TURNSTILE_DEBUG"):
            traceback.print_exc()
        _support.error(f"internal error ({type(exc).__name__}: {exc}); please report it", secrets)
        return EXIT_SOFTWARE
