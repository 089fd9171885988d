"""``turnstile queue work QUEUE -- CMD …``: a worker that runs CMD once per message.

Built on :meth:`turnstile.Queue.work` (which claims, extends visibility while CMD runs, acks,
nacks with a backoff and dead-letters after ``--max-attempts``): this module only turns a
message into a child process and its exit code into an ack or a nack, and drains on
SIGTERM/SIGINT. CMD's exit codes follow ``turnstile run`` (128+N when killed by signal N).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from types import FrameType
from typing import Any

from .. import Message, Queue
from .._core import validate
from .._core.payload import encode_payload
from .._sync.queue import MAX_PREFETCH
from ..errors import InvalidArgument
from . import _support
from ._support import EXIT_NOT_FOUND, EXIT_OK, EXIT_SIGNAL_BASE

GRACE_DEFAULT = 30.0
STOP_RETRY = 0.1  # seconds between the drain's repeated Queue.stop() calls
# A command killed by a signal: how long to wait for the worker's own handling of the same
# signal (the drain's thread, told by the handler) before treating the exit as the
# command's failure.
SIGNAL_SETTLE = 2.0
KILL_AFTER_DEFAULT = 10.0
# Signals that make the worker drain. A second one ends the grace period at once.
DRAINING: tuple[signal.Signals, ...] = tuple(
    getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n)
)

EPILOG = """\
examples:
  turnstile queue work webhooks -- ./handle-webhook.sh
  turnstile queue work webhooks --concurrency 4 --visibility-timeout 60 -- python handle.py
  turnstile queue work jobs --max-attempts 3 --backoff 5 -- ./job   # dead letter after 3
  turnstile queue work jobs --concurrency 4 --prefetch 16 -- ./job  # batch claims

CMD runs once per message: the payload on its stdin (bytes as they were put, anything else
as compact JSON), and in its environment TURNSTILE_QUEUE, TURNSTILE_MESSAGE_ID,
TURNSTILE_MESSAGE_KEY (unset for a message without a key) and TURNSTILE_ATTEMPT (1 on the
first delivery). Exit 0 acks the message; any other exit nacks it: it is delivered again
after --backoff * 2^(attempt-1) seconds (at most --max-backoff), and after --max-attempts
deliveries it becomes a dead letter holding the exit code. While CMD runs its message is kept
invisible (extended every visibility-timeout/3); if the worker dies (kill -9, a lost host)
the message is delivered again once --visibility-timeout passes.

SIGTERM, SIGINT or SIGHUP drain: take no new message, wait up to --grace seconds for the
running commands, then send them SIGTERM (SIGKILL after --kill-after more seconds); their
messages (and those of commands killed by the same signal, e.g. a terminal's Ctrl-C) are
nacked for delivery at once. A second signal ends the grace period at once. With
--prefetch N each slot claims up to N messages at once (distinct keys, one store step: on
PostgreSQL one commit per batch instead of per message) and runs them in turn; a drain lets
it run the rest of its batch within the grace period, and what has not started when the
grace period ends is delivered again at once.

exit codes: 0 stopped (drained after a signal, --max-messages handled, or --idle-timeout
passed); 127 CMD not found; 2 bad arguments; 69 store unavailable; 78 bad URL.
"""


def register(sub: Any) -> None:
    """Add ``work`` to the ``turnstile queue`` subcommands (called from cli/queue.py)."""
    p = _support.command_parser(
        sub,
        "work",
        help="run a command once per message (a worker)",
        description=(
            "Take messages from QUEUE and run CMD once per message, at most --concurrency\n"
            "at a time (per-key order is kept: one message per key in flight). Exit 0 acks,\n"
            "any other exit nacks (backoff, then dead letter)."
        ),
        epilog=EPILOG,
    )
    p.usage = "%(prog)s [-h] QUEUE [options] -- CMD [ARG ...]"
    _add_options(p)
    # Everything from QUEUE on: argparse cannot put an optional after a positional that is
    # followed by "-- CMD …", so work_command splits this at "--" and parses the options
    # between QUEUE and "--" with the same definitions (see _split).
    p.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="QUEUE [OPTIONS] -- CMD [ARG ...]",
        help="the queue, then the command run once per message (after --)",
    )
    p.set_defaults(handler=work_command, work_parser=p)


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--concurrency",
        metavar="N",
        type=_support.int_type("--concurrency", 1, 1000),
        default=1,
        help="commands run at once by this worker (1 to 1000; default 1)",
    )
    p.add_argument(
        "--prefetch",
        metavar="N",
        type=_support.int_type("--prefetch", 1, MAX_PREFETCH),
        default=1,
        help="messages each of the --concurrency slots claims in one store step and runs one "
        f"after another; their acks go with its next claim (1 to {MAX_PREFETCH}; default 1)",
    )
    p.add_argument(
        "--queue-concurrency",
        metavar="N",
        type=_support.limit_type("--queue-concurrency"),
        help="take a message only while fewer than N messages of QUEUE are in flight, "
        "across every worker (default: no cap)",
    )
    p.add_argument(
        "--visibility-timeout",
        metavar="S",
        type=_seconds_type("--visibility-timeout", validate.visibility_timeout),
        default=30.0,
        help="seconds a message stays invisible if the worker dies; extended every third "
        "of it while CMD runs (default 30)",
    )
    p.add_argument(
        "--max-attempts",
        metavar="N",
        type=_support.int_type("--max-attempts", 1, validate.MAX_ATTEMPTS),
        default=5,
        help="deliveries before dead letter (default 5)",
    )
    p.add_argument(
        "--backoff",
        metavar="S",
        type=_seconds_type("--backoff", validate.delay),
        default=1.0,
        help="after a failure, deliver again after S * 2^(attempt-1) seconds (default 1)",
    )
    p.add_argument(
        "--max-backoff",
        metavar="S",
        type=_seconds_type("--max-backoff", validate.delay),
        default=60.0,
        help="longest backoff (default 60)",
    )
    p.add_argument(
        "--grace",
        metavar="S",
        type=_support.timeout_type("--grace"),
        default=GRACE_DEFAULT,
        help="after SIGTERM/SIGINT, wait this long for running commands before "
        f"terminating them (default {GRACE_DEFAULT:g})",
    )
    p.add_argument(
        "--kill-after",
        metavar="S",
        type=_support.timeout_type("--kill-after"),
        default=KILL_AFTER_DEFAULT,
        help="seconds between the SIGTERM that ends the grace period and SIGKILL "
        f"(default {KILL_AFTER_DEFAULT:g})",
    )
    p.add_argument(
        "--idle-timeout",
        metavar="S",
        type=_support.timeout_type("--idle-timeout"),
        default=None,
        help="stop after S seconds without a message (default: run until stopped)",
    )
    p.add_argument(
        "--max-messages",
        metavar="N",
        type=_support.int_type("--max-messages", 1, 2**62),
        default=None,
        help="stop after N messages (default: no limit)",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="a line on stderr per message handled"
    )


def _split(args: argparse.Namespace) -> list[str]:
    """Read QUEUE and the options after it from ``args.rest`` into ``args``; return CMD."""
    parser: argparse.ArgumentParser = args.work_parser
    rest: list[str] = list(args.rest)
    if "--" in rest:
        cut = rest.index("--")
        head, command = rest[:cut], rest[cut + 1 :]
    else:
        head, command = rest, []
    inner = _support.ArgumentParser(prog=parser.prog, add_help=False)
    _support.add_url_option(inner)
    _add_options(inner)
    inner.add_argument("queue", metavar="QUEUE", type=_support.name_type("QUEUE"))
    # Options given before QUEUE are in ``args`` already, with the defaults of the others:
    # argparse sets a default only for an attribute the namespace lacks, so these stay
    # unless given again after QUEUE.
    inner.parse_args(head, namespace=args)
    return command


def _seconds_type(option: str, check: Any) -> Any:
    def parse(text: str) -> float:
        value = _support._parse_float(text, "a number of seconds")
        try:
            return float(check(value, option))
        except InvalidArgument as exc:
            raise _support.type_error(option, exc) from None

    return parse


class CommandFailed(Exception):
    """CMD exited non-zero: the message is nacked (``Queue.work`` records this text)."""


class _Runner:
    """The handler given to :meth:`Queue.work`: runs CMD for one message, and knows every
    running child so that a drain can terminate them."""

    def __init__(self, command: list[str], queue: str, verbose: bool) -> None:
        self.command = command
        self.queue = queue
        self.verbose = verbose
        self.lock = threading.Lock()
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        # Commands counted by running(): from just before their start until they end, so a
        # command whose start another thread has not registered yet is counted too.
        self.active = 0
        self.terminated = False  # the grace period ended: running children were told to stop
        self.draining: int | None = None  # the signal that started a drain
        self.drain_started = threading.Event()

    def __call__(self, message: Message) -> None:
        if self.terminated:
            # The grace period is over and this message (the rest of a --prefetch batch) has
            # not started: deliver it again at once rather than start a command to kill.
            message.nack(0.0, "not started: the worker was shutting down")
            raise CommandFailed("not started: the worker was shutting down")
        body, _ = encode_payload(message.payload)
        env = dict(os.environ)
        env.update(
            TURNSTILE_QUEUE=self.queue,
            TURNSTILE_MESSAGE_ID=message.id,
            TURNSTILE_ATTEMPT=str(message.attempt),
        )
        env.pop("TURNSTILE_MESSAGE_KEY", None)
        if message.key is not None:
            env["TURNSTILE_MESSAGE_KEY"] = message.key
        started = time.monotonic()
        with self.lock:
            self.active += 1
        try:
            try:
                child = subprocess.Popen(self.command, stdin=subprocess.PIPE, env=env)
            except OSError as exc:
                reason = exc.strerror or exc
                raise CommandFailed(f"cannot execute {self.command[0]}: {reason}") from None
            with self.lock:
                self.children[child.pid] = child
                stopping = self.terminated
            if stopping:  # started in the instant the grace period ended
                child.terminate()
            try:
                with contextlib.suppress(BrokenPipeError):
                    child.communicate(body)  # CMD may leave stdin unread: that is fine
            finally:
                with self.lock:
                    self.children.pop(child.pid, None)
        finally:
            with self.lock:
                self.active -= 1
        code = child.returncode
        if code < 0:
            # Killed by a signal: if it was a terminal's Ctrl-C (or a SIGTERM to the process
            # group), the same signal reached this process too, but the drain handles it on
            # a thread of its own and may not have yet. Give it a moment before judging.
            self.drain_started.wait(SIGNAL_SETTLE)
            code = EXIT_SIGNAL_BASE - code
        took = time.monotonic() - started
        shown = f"message {message.id} (key {_key(message)}, attempt {message.attempt})"
        if code == 0:
            if self.verbose:
                _support.note(f"{shown}: command exited with 0 after {took:.3f} s; acking")
            return
        if self.terminated or (self.draining is not None and code in _stopped_by(self.draining)):
            # Told to stop by us, or by the same signal (a terminal's Ctrl-C reaches the
            # whole process group): not the message's fault, so no backoff.
            _support.note(f"{shown}: command stopped by the drain ({code}); delivering it again")
            message.nack(0.0, f"command stopped by a worker shutdown (exit {code})")
            raise CommandFailed(f"command stopped by a worker shutdown (exit {code})")
        _support.note(f"{shown}: command exited with {code} after {took:.3f} s; nacking")
        raise CommandFailed(f"command exited with {code}")

    def running(self) -> int:
        """Commands started or starting and not yet ended. A command can be running (its
        first line done) before the thread that started it has registered it, so counting
        only registered children would say 1 where 2 run."""
        with self.lock:
            return self.active

    def terminate_all(self, signum: int) -> None:
        with self.lock:
            self.terminated = True
            children = list(self.children.values())
        for child in children:
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signum)


def _key(message: Message) -> str:
    return "-" if message.key is None else repr(message.key)  # repr escapes control characters


def _stopped_by(signum: int) -> tuple[int, ...]:
    """Exit codes of a command ended by the drain's signal, SIGTERM or SIGKILL."""
    return tuple(EXIT_SIGNAL_BASE + s for s in {signum, signal.SIGTERM, signal.SIGKILL})


class _Drain:
    """The worker's SIGTERM/SIGINT/SIGHUP handling: the first signal stops claiming
    (:meth:`Queue.stop`) and starts the grace period; when it ends (or on a second signal)
    running commands get SIGTERM, then SIGKILL after ``kill_after``.

    Python runs a signal handler in the main thread between two of its bytecodes, wherever
    that thread was: possibly holding a lock the handler's work would take (an Event's, the
    threading module's own when a worker thread just ended). So the handler only writes the
    signal's number to a pipe; a thread started by :meth:`install` reads it and does the
    rest."""

    def __init__(self, queue: Queue, runner: _Runner, grace: float, kill_after: float) -> None:
        self.queue = queue
        self.runner = runner
        self.grace = grace
        self.kill_after = kill_after
        self.signal: int | None = None
        self.hurry = threading.Event()
        self.done = threading.Event()
        self.watcher: threading.Thread | None = None
        self.thread: threading.Thread | None = None
        self.previous: dict[int, Any] = {}
        self._read, self._write = os.pipe()  # not inherited by the commands (PEP 446)
        os.set_blocking(self._write, False)

    def install(self) -> None:
        self.watcher = threading.Thread(target=self._watch, name="turnstile-signals", daemon=True)
        self.watcher.start()
        for signum in DRAINING:
            current = signal.getsignal(signum)
            if current == signal.SIG_IGN:
                continue
            self.previous[signum] = current
            signal.signal(signum, self._on_signal)

    def restore(self) -> None:
        self.done.set()
        self.hurry.set()
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        with contextlib.suppress(OSError):
            os.write(self._write, b"\0")  # wakes the watcher, which sees done
        for thread in (self.watcher, self.thread):
            if thread is not None:
                thread.join()
        os.close(self._read)
        os.close(self._write)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):  # the pipe is full: signals are on their way already
            os.write(self._write, bytes([signum]))

    def _watch(self) -> None:
        while True:
            try:
                received = os.read(self._read, 64)
            except OSError:
                return
            if not received or self.done.is_set():
                return
            for signum in received:
                if signum:
                    self._received(signum)

    def _received(self, signum: int) -> None:
        if self.signal is not None:
            self.hurry.set()
            return
        self.signal = signum
        self.queue.stop()  # first: no new message from here on
        self.runner.draining = signum
        self.runner.drain_started.set()
        running = self.runner.running()
        _support.note(
            f"{signal.Signals(signum).name}: taking no new message; waiting up to "
            f"{validate.seconds_text(self.grace)} for {running} running command(s)"
        )
        self.thread = threading.Thread(target=self._grace, name="turnstile-drain", daemon=True)
        self.thread.start()

    def _grace(self) -> None:
        end = time.monotonic() + self.grace
        while not self.hurry.is_set():
            # Again and again: a signal that came before Queue.work started its loop found
            # nothing to stop (stop() is idempotent).
            self.queue.stop()
            left = end - time.monotonic()
            if left <= 0 or self.hurry.wait(min(left, STOP_RETRY)):
                break
        if self.done.is_set():
            return
        if self.runner.running():
            _support.note("grace period over: sending the running commands SIGTERM")
        self.runner.terminate_all(signal.SIGTERM)
        if self.done.wait(self.kill_after):
            return
        if self.runner.running():
            _support.note(
                f"still running after {validate.seconds_text(self.kill_after)}: sending SIGKILL"
            )
        self.runner.terminate_all(signal.SIGKILL)


def work_command(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.work_parser
    command = _split(args)
    if not command:
        parser.error("give the command to run after --, e.g. turnstile queue work QUEUE -- CMD")
    if args.backoff > args.max_backoff:
        parser.error(
            f"--backoff ({validate.seconds_text(args.backoff)}) must not be more than "
            f"--max-backoff ({validate.seconds_text(args.max_backoff)})"
        )
    if shutil.which(command[0]) is None:
        _support.error(f"command not found: {_support.printable(command[0])}")
        return EXIT_NOT_FOUND
    runner = _Runner(command, args.queue, args.verbose)
    with _support.connect(args) as client:
        if not client.characteristics.cross_process:
            _support.note(
                f"warning: {client.characteristics.scheme}:// is private to this process; "
                "no other process can put messages for this worker"
            )
        queue = client.queue(
            args.queue,
            visibility_timeout=args.visibility_timeout,
            max_attempts=args.max_attempts,
            concurrency=args.queue_concurrency,
        )
        drain = _Drain(queue, runner, args.grace, args.kill_after)
        drain.install()
        try:
            if args.verbose:
                _support.note(
                    f"working on queue {args.queue!r} with "
                    f"{args.concurrency} command(s) at a time"
                    + (f", claiming up to {args.prefetch} at once" if args.prefetch > 1 else "")
                )
            result = queue.work(
                runner,
                workers=args.concurrency,
                idle_timeout=args.idle_timeout,
                max_messages=args.max_messages,
                backoff=args.backoff,
                max_backoff=args.max_backoff,
                handle_signals=False,
                prefetch=args.prefetch,
            )
        finally:
            drain.restore()
    # The reason in the command's own words: its flags, not the Python parameters.
    flags = {"max_messages": "--max-messages", "idle_timeout": "--idle-timeout"}
    why = flags.get(result.stopped_by or "", result.stopped_by)
    if drain.signal is not None:
        why = signal.Signals(drain.signal).name
    _support.note(
        f"stopped ({why}): {result.acked} acked, {result.failed} failed, "
        f"{result.lost} past their visibility timeout"
    )
    return EXIT_OK
