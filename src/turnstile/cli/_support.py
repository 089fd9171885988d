"""What every ``turnstile`` command shares: exit codes, the ``--url`` option, argument types
that validate with :mod:`turnstile._core.validate`, connecting, and safe printing."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

from .. import Client
from .._core import urls, validate
from ..errors import ConfigurationError, InvalidArgument

# Exit codes (docs/cli.md lists them; keep both in step).
EXIT_OK = 0
EXIT_FAILURE = 1  # a Turnstile error without a more specific code; the demo found a problem
EXIT_USAGE = 2  # bad arguments (argparse uses 2 as well)
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: the store cannot be reached
EXIT_SOFTWARE = 70  # EX_SOFTWARE: an unexpected internal error (a bug: please report it)
EXIT_TIMEOUT = 75  # EX_TEMPFAIL: not granted within --timeout (like `flock -w`)
EXIT_CONFIG = 78  # EX_CONFIG: bad URL scheme, missing optional driver
EXIT_LEASE_LOST = 79  # run: the lease was lost while CMD ran
EXIT_CANNOT_EXECUTE = 126  # run: CMD exists but cannot be executed
EXIT_NOT_FOUND = 127  # run: CMD not found
EXIT_SIGNAL_BASE = 128  # killed by signal N: 128 + N (like a shell)



def default_store() -> str:
    """Where the default store is, for help texts: the path on this host if it can be
    told, else how it is found."""
    try:
        return urls.default_url()
    except ConfigurationError:
        return f"sqlite:///{urls.DEFAULT_DESCRIPTION}"


def url_help() -> str:
    return (
        "store URL: memory://, sqlite:///path, redis://…, postgresql://…, http://… "
        f"(default: ${urls.ENV_VAR}, else one SQLite file per user and host, here "
        f"{default_store()})"
    )


Handler = Callable[[argparse.Namespace], int]


STOPPING = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class Terminated(BaseException):
    """Raised by our signal handlers while nothing can be forwarded (e.g. while waiting in
    line), so that ``finally`` blocks run and the caller leaves the line."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def command_parser(
    subparsers: Any,  # argparse._SubParsersAction, which typeshed keeps private
    name: str,
    *,
    help: str,
    description: str,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """A subcommand parser with the options every command shares (``--url``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_url_option(parser)
    return parser


def add_url_option(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a subcommand's parser must not overwrite `turnstile --url X <command>`.
    parser.add_argument("--url", metavar="URL", default=argparse.SUPPRESS, help=url_help())


def given_url(args: argparse.Namespace) -> str | None:
    url: str | None = getattr(args, "url", None)
    return url


def resolved_url(args: argparse.Namespace) -> str:
    return urls.resolve_url(given_url(args))


def connect(args: argparse.Namespace) -> Client:
    # The public connect() does the $TURNSTILE_URL / default fallback.
    from .. import connect as _connect

    return _connect(given_url(args))


# A signal can trip Python's handler while the main thread is on its way into a blocking
# call, or land on another thread: the handler runs only when the main thread comes back to
# the interpreter, and a wait in line could sleep through SIGTERM until its turn. Python's
# C-level handler also writes the signal's number to the wakeup fd; a watcher thread reading
# it interrupts the main thread with NUDGE (a handler that does nothing: the interrupted call
# runs the pending handlers before it carries on) until a stopping handler has run.
NUDGE: signal.Signals | None = getattr(signal, "SIGURG", None)  # ignored by default
NUDGE_EVERY = 0.05


class _SignalWatcher:
    def __init__(self, signals: set[int]) -> None:
        self.handled = threading.Event()
        self._signals = signals
        self._main = threading.main_thread().ident or 0
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._thread = threading.Thread(
            target=self._watch, name="turnstile-signal-watcher", daemon=True
        )

    @property
    def fd(self) -> int:
        return self._writer.fileno()

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        assert NUDGE is not None
        while True:
            try:
                data = self._reader.recv(64)
            except OSError:
                return
            if not data:
                return
            if self._signals.isdisjoint(data):
                continue  # the nudges themselves, and signals we do not stop on
            while not self.handled.is_set():
                with contextlib.suppress(OSError, ValueError):
                    signal.pthread_kill(self._main, NUDGE)
                self.handled.wait(NUDGE_EVERY)

    def close(self) -> None:
        self.handled.set()
        with contextlib.suppress(OSError):
            self._reader.shutdown(socket.SHUT_RDWR)
        self._thread.join(1.0)
        self._reader.close()
        self._writer.close()


class StopOnSignals:
    """``with StopOnSignals():`` SIGTERM/SIGHUP raise :class:`Terminated` (SIGINT raises
    KeyboardInterrupt, as it does by default) so that ``finally`` blocks run: a blocking
    acquire leaves the line, the demo stops its workers. Signals the caller chose to ignore
    stay ignored. A watcher thread makes sure the handler runs even if the signal came as
    the main thread went into a blocking call; :meth:`handover` stops it for code that
    installs handlers of its own inside the block (``turnstile run``'s supervisor)."""

    def __init__(self) -> None:
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
        self._watcher: _SignalWatcher | None = None
        self._old_fd: int | None = None

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if self._watcher is not None:
            self._watcher.handled.set()
        raise Terminated(signum)

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        if self._watcher is not None:
            self._watcher.handled.set()
        raise KeyboardInterrupt

    def __enter__(self) -> StopOnSignals:
        handlers: dict[int, Callable[[int, FrameType | None], None]] = dict.fromkeys(
            STOPPING, self._stop
        )
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            handlers[signal.SIGINT] = self._interrupt
        for signum, handler in handlers.items():
            current = signal.getsignal(signum)
            if current == signal.SIG_IGN:
                continue
            self._previous[signum] = current
            signal.signal(signum, handler)
        if NUDGE is not None and hasattr(signal, "pthread_kill") and self._previous:
            self._watcher = _SignalWatcher(set(self._previous))
            self._previous[NUDGE] = signal.signal(NUDGE, _ignore)
            self._old_fd = signal.set_wakeup_fd(self._watcher.fd, warn_on_full_buffer=False)
            self._watcher.start()
        return self

    def handover(self) -> None:
        """Stop watching (the handlers stay until the block ends)."""
        if self._old_fd is not None:
            signal.set_wakeup_fd(self._old_fd)
            self._old_fd = None
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    def __exit__(self, *exc: object) -> None:
        self.handover()
        for signum, old in self._previous.items():
            signal.signal(signum, old)
        self._previous.clear()


def stop_on_signals() -> StopOnSignals:
    return StopOnSignals()


def _ignore(signum: int, frame: FrameType | None) -> None:
    return None


# -- argument types: parse, validate with the core's rules, name the argument -------------


def type_error(option: str, exc: InvalidArgument) -> argparse.ArgumentTypeError:
    """The core's message without its leading argument name (``option``, or the Python
    parameter it was checked as): argparse names the CLI argument itself."""
    message = str(exc)
    if message.startswith(option + " "):
        message = message[len(option) + 1 :]
    return argparse.ArgumentTypeError(message)



def _parse_float(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def _parse_int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def ttl_type(option: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _parse_float(text, "a number of seconds")
        try:
            return validate.ttl(value, option)
        except InvalidArgument as exc:
            raise type_error(option, exc) from None

    return parse


def timeout_type(option: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _parse_float(text, "a number of seconds")
        if math.isinf(value) and value > 0:
            raise argparse.ArgumentTypeError(
                f"must be finite; leave {option} out to wait without a time limit"
            )
        if math.isnan(value) or not 0 <= value <= validate.MAX_TIMEOUT:
            raise argparse.ArgumentTypeError(
                f"must be between 0 and {validate.MAX_TIMEOUT:.0f} seconds (30 days), got "
                f"{text!r}; leave {option} out to wait without a time limit"
            )
        return value

    return parse


def seconds_type(
    option: str, low: float = 0.0, high: float = validate.MAX_TIMEOUT
) -> Callable[[str], float]:
    """A number of seconds in [low, high] (finite)."""

    def parse(text: str) -> float:
        value = _parse_float(text, "a number of seconds")
        try:
            return validate.seconds(value, option, low=low, high=high)
        except InvalidArgument as exc:
            raise type_error(option, exc) from None

    return parse


def int_type(option: str, low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _parse_int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def add_priority_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--priority`` and ``--ageing``: where a new place in line goes (docs/admission.md)."""
    parser.add_argument(
        "--priority",
        metavar="K",
        type=int_type("--priority", -validate.MAX_PRIORITY, validate.MAX_PRIORITY),
        default=0,
        help=f"{what}: a larger K is served first, in arrival order within a level "
        f"({-validate.MAX_PRIORITY} to {validate.MAX_PRIORITY}; default 0)",
    )
    parser.add_argument(
        "--ageing",
        metavar="S",
        type=seconds_type("--ageing", validate.MIN_AGEING, validate.MAX_AGEING),
        default=None,
        help="seconds of waiting worth one priority level, so low priorities are not "
        f"starved (e.g. {validate.DEFAULT_AGEING:g}; default: strict priorities)",
    )


def limit_type(option: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _parse_int(text)
        try:
            return validate.limit(value, option)
        except InvalidArgument as exc:
            raise type_error(option, exc) from None

    return parse


def name_type(option: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return validate.name(text, option)
        except InvalidArgument as exc:
            raise type_error(option, exc) from None

    return parse


def holder_type(option: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return validate.holder(text, option)
        except InvalidArgument as exc:
            raise type_error(option, exc) from None

    return parse


def milliseconds_type(option: str, high: float) -> Callable[[str], float]:
    """Milliseconds in [0, high], returned in seconds."""

    def parse(text: str) -> float:
        value = _parse_float(text, "a number of milliseconds")
        if math.isnan(value) or not 0 <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be between 0 and {high:g} milliseconds, got {text!r}"
            )
        return value / 1000.0

    return parse


# -- output ---------------------------------------------------------------------------------


def printable(text: str) -> str:
    """``text`` with control characters escaped, so a name or holder id can never move the
    cursor or recolour a terminal. For quoted text use ``{text!r}`` alone: ``repr`` escapes
    the same characters, and quoting this function's result would escape them twice."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def duration(seconds: float) -> str:
    """Short human duration: 0.042s, 3.21s, 12.3s, 5m03s, 2h05m, 3d04h."""
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 10:
        text = f"{s:.3f}s" if s < 1 else f"{s:.2f}s"
    elif s < 60:
        text = f"{s:.1f}s"
    elif s < 3600:
        text = f"{int(s // 60)}m{int(s % 60):02d}s"
    elif s < 86400:
        text = f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    else:
        text = f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"
    return sign + text


def secrets_of(url: str | None) -> list[str]:
    """Every secret in ``url`` (password, token, ``?password=``…), to scrub from messages."""
    return urls.secrets_in(url)


# Secrets of the URLs this command was given (set by main): scrubbed from every message.
SECRETS: list[str] = []


def set_secrets(secrets: list[str]) -> None:
    SECRETS[:] = secrets


def error(message: str, secrets: list[str] | None = None) -> None:
    """One line on stderr: ``turnstile: error: …`` (never a traceback, never a password)."""
    line = urls.scrub(message, [*SECRETS, *(secrets or [])]).replace("\n", " ").strip()
    print(f"turnstile: error: {line}", file=sys.stderr, flush=True)


def print_json(data: Any) -> None:
    """Every ``--json`` output: one line (for pipes, ``jq`` and line-based logs), indented
    when stdout is a terminal (for people)."""
    import json

    indent = 2 if sys.stdout.isatty() else None
    separators = None if indent else (",", ":")
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=indent, separators=separators))
    sys.stdout.write("\n")
    sys.stdout.flush()


def note(message: str) -> None:
    print(f"turnstile: {urls.scrub(message, SECRETS)}", file=sys.stderr, flush=True)


def quiet_library_logs() -> None:
    """The library logs warnings (a lost lease, a failed renewal) through ``logging``; the
    command line reports those itself, in its own words, so keep Python's last-resort
    handler from printing them a second time."""
    logging.getLogger("turnstile").addHandler(logging.NullHandler())


class ScrubbingFormatter(logging.Formatter):
    """A formatter that blots out the secrets of the command's URLs (:data:`SECRETS`) and any
    ``password=…``-like pair, whatever a library or driver logged."""

    def format(self, record: logging.LogRecord) -> str:
        return urls.scrub(super().format(record), SECRETS)


def log_to_stderr(level: int = logging.WARNING) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ScrubbingFormatter("turnstile: %(message)s"))
    logger = logging.getLogger("turnstile")
    logger.addHandler(handler)
    logger.setLevel(level)


def env_url_secrets() -> list[str]:
    return secrets_of(os.environ.get(urls.ENV_VAR))
