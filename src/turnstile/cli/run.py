"""``turnstile run``: run a command while holding a lock or a semaphore slot, like
``flock(1)`` but across every process that shares the store URL; or, with ``--rate-limit``,
once a rate limit admits it (waiting in line for its slot), with nothing held after that.

While waiting in line, SIGINT/SIGTERM/SIGHUP make ``turnstile`` leave the line and exit
128+N. Once the lease is held, the lease is renewed (every ttl/3) while CMD runs, and
SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to ``turnstile`` are forwarded to
CMD; a signal a terminal sent to its whole foreground group (Ctrl-C, Ctrl-\\) already reached
CMD and is not sent twice. On Linux this is decided from ``siginfo.si_code`` via
``sigwaitinfo``; elsewhere every such signal is forwarded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from .. import AcquireTimeout, BackendUnavailable, InvalidArgument, Lease, LeaseLost, Semaphore
from .._async import rate_limit
from .._core import timing, validate
from . import _support
from ._support import (
    EXIT_CANNOT_EXECUTE,
    EXIT_FAILURE,
    EXIT_LEASE_LOST,
    EXIT_NOT_FOUND,
    EXIT_SIGNAL_BASE,
    EXIT_TIMEOUT,
)

EPILOG = """\
examples:
  turnstile run --lock deploy -- ./deploy.sh                   # one deploy at a time
  turnstile run --lock nightly --timeout 0 -- ./job || echo busy   # skip if running
  turnstile run --semaphore shared-db --limit 5 --timeout 300 -- ./migrate-tenant 42
  turnstile run --rate-limit github-api --rate 30/m --burst 5 -- ./sync-repo x/y

CMD sees TURNSTILE_NAME, TURNSTILE_HOLDER, TURNSTILE_FENCING_TOKEN (larger for every later
grant on the name) and TURNSTILE_LIMIT in its environment (with --rate-limit: TURNSTILE_NAME,
TURNSTILE_HOLDER and TURNSTILE_ADMITTED_AT, the admission time on the store's clock);
TURNSTILE_TOKEN (the HTTP service's bearer token) and TURNSTILE_URL are passed on as
turnstile got them.

Without --url or $TURNSTILE_URL the store is one SQLite file per user and host, whatever the
working directory: $XDG_STATE_HOME/turnstile/turnstile.db (default
~/.local/state/turnstile/turnstile.db).

exit codes: CMD's own exit code (128+N if CMD was killed by signal N); 75 not granted within
--timeout (--timeout-exit-code; with --rate-limit at once when the slot is further away);
79 the lease was lost while CMD ran (--lost-exit-code);
126 CMD cannot be executed; 127 CMD not found; 2 bad arguments; 69 store unavailable;
78 configuration (bad or empty URL, missing driver, not a database); 128+N turnstile
itself stopped by signal N while waiting.
"""

# Forwarded to CMD once it runs. While waiting in line only the first three are handled.
FORWARDED: tuple[signal.Signals, ...] = tuple(
    getattr(signal, n)
    for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, n)
)
# Python ignores these at startup; CMD gets the defaults back (as subprocess does).
RESET_FOR_CHILD = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, n))
SI_KERNEL = 0x80  # Linux si_code of signals the kernel sends, e.g. a terminal's Ctrl-C
_LINUX = sys.platform.startswith("linux")
# sigwaitinfo lets us see who sent a signal; without it (macOS) we forward every signal.
_SIGWAIT = all(hasattr(signal, f) for f in ("sigwaitinfo", "pthread_sigmask", "pthread_kill"))
KILL_AFTER_DEFAULT = 10.0
TICK = 0.5  # the supervisor re-checks CMD and the lease at least this often (seconds)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = _support.command_parser(
        subparsers,
        "run",
        help="run a command while holding a lock or a semaphore slot, or once a rate "
        "limit admits it",
        description=(
            "Run CMD while holding a fair leased lock (or one of --limit semaphore slots) on\n"
            "NAME, shared by every process that uses the same store URL: like flock(1), but\n"
            "across processes on every host that reaches the store. Waiters are served in\n"
            "arrival order; the lease is renewed while CMD runs; CMD's exit code is passed\n"
            "through.\n\n"
            "With --rate-limit NAME --rate N/UNIT, wait in line until the rate limit admits\n"
            "this run (at most --burst at once, at most N + burst per UNIT), then run CMD in\n"
            "turnstile's place (exec): nothing is held while it runs."
        ),
        epilog=EPILOG,
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--lock", metavar="NAME", type=_support.name_type("--lock"), help="lock name"
    )
    target.add_argument(
        "--semaphore",
        metavar="NAME",
        type=_support.name_type("--semaphore"),
        help="semaphore name (with --limit)",
    )
    target.add_argument(
        "--group",
        metavar="NAME",
        type=_support.name_type("--group"),
        help="semaphore group name (with --key, --per-key and --total): at most --per-key "
        "runs per key and --total in all",
    )
    target.add_argument(
        "--rate-limit",
        metavar="NAME",
        type=_support.name_type("--rate-limit"),
        help="rate limit name (with --rate): wait in line to be admitted, then run CMD",
    )
    parser.add_argument(
        "--rate",
        metavar="N/UNIT",
        type=rate_type("--rate"),
        help="the rate of --rate-limit, or of a --semaphore's starts: N admissions per UNIT, "
        "where UNIT is s, m, h, a "
        "number of seconds, or a number with s, m or h (10/s, 30/m, 1000/h, 5/2.5, 100/15m)",
    )
    parser.add_argument(
        "--burst",
        metavar="N",
        type=_support.int_type("--burst", 1, rate_limit.MAX_RATE),
        help="with --rate: admissions at once from idle (1 to 1000000; default 1)",
    )
    parser.add_argument(
        "--limit",
        metavar="N",
        type=_support.limit_type("--limit"),
        help="number of slots of --semaphore (1 to 1000000)",
    )
    parser.add_argument(
        "--key",
        metavar="K",
        help="with --group: the key this run takes a slot of (a tenant, an account; 1 to "
        f"{validate.MAX_KEY_BYTES} bytes)",
    )
    parser.add_argument(
        "--per-key",
        metavar="N",
        type=_support.limit_type("--per-key"),
        help="with --group: at most N runs per key (1 to 1000000)",
    )
    parser.add_argument(
        "--total",
        metavar="N",
        type=_support.limit_type("--total"),
        help="with --group: at most N runs across keys (1 to 1000000)",
    )
    parser.add_argument(
        "--ttl",
        metavar="S",
        type=_support.ttl_type("--ttl"),
        default=None,
        help="lease time in seconds, renewed every ttl/3 while CMD runs; a crashed holder "
        "frees the name after at most this long (0.05 to 2592000; default 30)",
    )
    parser.add_argument(
        "--timeout",
        metavar="S",
        type=_support.timeout_type("--timeout"),
        default=None,
        help="give up after waiting S seconds (0: do not wait; default: wait without limit)",
    )
    parser.add_argument(
        "--holder",
        metavar="ID",
        type=_support.holder_type("--holder"),
        help="holder id shown by status and given to CMD (default: host/pid/random); "
        "must be unique among concurrent runs, a reused id shares the lease",
    )
    parser.add_argument(
        "--on-lost",
        choices=("terminate", "wait"),
        default="terminate",
        help="if the lease is lost while CMD runs: send CMD SIGTERM (then SIGKILL after "
        "--kill-after) or let it finish; either way exit with --lost-exit-code "
        "(default: terminate)",
    )
    parser.add_argument(
        "--kill-after",
        metavar="S",
        type=_support.seconds_type("--kill-after"),
        default=KILL_AFTER_DEFAULT,
        help="after a lost lease with --on-lost terminate: seconds from the SIGTERM to a "
        f"SIGKILL if CMD still runs (default {KILL_AFTER_DEFAULT:g}; 0: SIGKILL at once). "
        "Signals sent to turnstile itself are passed to CMD as they are, never escalated",
    )
    parser.add_argument(
        "--timeout-exit-code",
        metavar="N",
        type=_support.int_type("--timeout-exit-code", 0, 255),
        default=EXIT_TIMEOUT,
        help=f"exit code when --timeout passes (default {EXIT_TIMEOUT}, EX_TEMPFAIL)",
    )
    parser.add_argument(
        "--lost-exit-code",
        metavar="N",
        type=_support.int_type("--lost-exit-code", 0, 255),
        default=EXIT_LEASE_LOST,
        help=f"exit code when the lease was lost while CMD ran (default {EXIT_LEASE_LOST})",
    )
    _support.add_priority_options(parser, "place in line")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="say on stderr when the lease is granted"
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD [ARG ...]",
        help="the command to run while holding the lease",
    )
    parser.set_defaults(handler=run_command, run_parser=parser)


def run_command(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.run_parser
    command: list[str] = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("give the command to run after --, e.g. turnstile run --lock NAME -- CMD")
    if args.semaphore is not None and args.limit is None:
        parser.error("--semaphore needs --limit N (1 to 1000000)")
    if args.lock is not None and args.limit is not None:
        parser.error("--limit applies only to --semaphore (a lock has exactly one slot)")
    group_options = (("--key", args.key), ("--per-key", args.per_key), ("--total", args.total))
    if args.group is not None:
        missing = [option for option, value in group_options if value is None]
        if missing:
            parser.error(f"--group needs {', '.join(missing)}")
        if args.limit is not None:
            parser.error("--limit does not apply to --group (its total is --total)")
        try:
            validate.group_key(args.key, "--key")
        except InvalidArgument as exc:
            parser.error(str(exc))
    else:
        for option, value in group_options:
            if value is not None:
                parser.error(f"{option} applies only to --group")
    if args.rate_limit is not None:
        return _run_rate_limited(args, parser, command)
    if args.semaphore is None:
        for option, value in (("--rate", args.rate), ("--burst", args.burst)):
            if value is not None:
                parser.error(f"{option} applies only to --rate-limit and --semaphore")
    elif args.burst is not None and args.rate is None:
        parser.error("--burst goes with --rate")
    ttl: float = 30.0 if args.ttl is None else args.ttl

    if args.group is not None:
        name, kind, limit = args.group, "group", args.total
    else:
        name = args.lock if args.lock is not None else args.semaphore
        kind = "lock" if args.lock is not None else "semaphore"
        limit = 1 if args.lock is not None else args.limit
    holder: str = args.holder or timing.default_holder()
    alarm = _LostAlarm()
    if args.verbose:
        _support.log_to_stderr()

    client = _support.connect(args)
    try:
        if not client.characteristics.cross_process:
            _support.note(
                f"warning: {client.characteristics.scheme}:// is private to this process; "
                "no other process shares this lock"
            )
        sem: Semaphore
        rank = {"priority": args.priority, "ageing": args.ageing}
        shown = f"{kind} {name!r}"
        if kind == "lock":
            sem = client.lock(name, ttl, on_lost=alarm, **rank)
        elif kind == "group":
            group = client.semaphore_group(
                name, args.per_key, limit, ttl, on_lost=alarm, **rank
            )
            sem = group.key(args.key)
            shown = f"group {name!r} key {args.key!r}"
        else:
            rated: dict[str, Any] = {}
            if args.rate is not None:
                rate, per = args.rate
                rated = {"rate": rate, "per": per, "burst": args.burst or 1}
            sem = client.semaphore(name, limit, ttl, on_lost=alarm, **rank, **rated)
        started = time.monotonic()
        lease: Lease | None = None
        try:
            # Until the supervisor forwards them, SIGTERM/SIGHUP end us cleanly: leaving the
            # line, or releasing a lease granted a moment ago.
            with _support.stop_on_signals() as signals:
                try:
                    lease = sem.acquire(timeout=args.timeout, holder=holder)
                except AcquireTimeout:
                    _support.error(_timeout_message(sem, shown, args.timeout))
                    return int(args.timeout_exit_code)
                if args.verbose:
                    _support.note(
                        f"holding {shown} as {holder!r} "
                        f"(token {lease.token}) after {time.monotonic() - started:.3f} s"
                    )
                env = dict(os.environ)
                env.update(
                    TURNSTILE_NAME=name,
                    TURNSTILE_HOLDER=holder,
                    TURNSTILE_FENCING_TOKEN=str(lease.token),
                    TURNSTILE_LIMIT=str(limit),
                )
                if kind == "group":
                    env["TURNSTILE_KEY"] = args.key
                else:
                    env.pop("TURNSTILE_KEY", None)  # an enclosing group run's
                if lease.started_at is not None:  # a semaphore's start rate admitted it
                    env["TURNSTILE_STARTED_AT"] = repr(lease.started_at)
                else:
                    env.pop("TURNSTILE_STARTED_AT", None)
                signals.handover()  # the supervisor handles signals from here
                return _Supervisor(lease, command, env, args, shown, alarm).run()
        finally:
            if lease is not None:
                # Idempotent; covers a signal between the grant and the supervisor.
                with contextlib.suppress(BackendUnavailable):
                    lease.release()
    finally:
        client.close()


UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def rate_type(option: str) -> Callable[[str], tuple[int, float]]:
    """``N/UNIT``: ``(rate, per)``, checked with the rate limit's own bounds."""

    def parse(text: str) -> tuple[int, float]:
        count, slash, unit = text.strip().partition("/")
        usage = (
            f"must be N/UNIT with UNIT s, m, h or a number of seconds (e.g. 10/s, 30/m, "
            f"5/2.5), got {text!r}"
        )
        if not slash or not count.strip().isdigit():
            raise argparse.ArgumentTypeError(usage)
        unit = unit.strip().lower()
        scale = 1.0
        if unit and unit[-1] in UNITS:
            unit, scale = unit[:-1], UNITS[unit[-1]]
        try:
            per = (float(unit) if unit else 1.0) * scale
        except ValueError:
            raise argparse.ArgumentTypeError(usage) from None
        try:
            rate = validate.count(int(count), "rate", rate_limit.MAX_RATE)
            per = validate.seconds(per, "per", low=rate_limit.MIN_PER, high=rate_limit.MAX_PER)
        except InvalidArgument as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return rate, per

    return parse


def _run_rate_limited(
    args: argparse.Namespace, parser: argparse.ArgumentParser, command: list[str]
) -> int:
    """Wait in line until the rate limit admits this run, then exec CMD: nothing is held
    while it runs, so turnstile has nothing left to do (signals reach CMD directly, and its
    exit code is the run's)."""
    if args.rate is None:
        parser.error("--rate-limit needs --rate N/UNIT, e.g. --rate 10/s")
    for option, value in (("--limit", args.limit), ("--ttl", args.ttl)):
        if value is not None:
            parser.error(f"{option} does not apply to --rate-limit (an admission holds nothing)")
    rate, per = args.rate
    burst: int = 1 if args.burst is None else args.burst
    name: str = args.rate_limit
    holder: str = args.holder or timing.default_holder()
    if args.verbose:
        _support.log_to_stderr()
    client = _support.connect(args)
    try:
        if not client.characteristics.cross_process:
            _support.note(
                f"warning: {client.characteristics.scheme}:// is private to this process; "
                "no other process shares this rate limit"
            )
        limiter = client.rate_limit(
            name, rate, per, burst, priority=args.priority, ageing=args.ageing
        )
        started = time.monotonic()
        with _support.stop_on_signals():  # leaves the line, then exits 128+N
            try:
                admitted_at = limiter.acquire(timeout=args.timeout, holder=holder)
            except AcquireTimeout as exc:
                _support.error(
                    f"not admitted by rate limit {name!r} within "
                    f"{validate.seconds_text(args.timeout or 0.0)}: {_reason(exc, name)}"
                )
                return int(args.timeout_exit_code)
        if args.verbose:
            _support.note(
                f"admitted by rate limit {name!r} as {holder!r} after "
                f"{time.monotonic() - started:.3f} s"
            )
    finally:
        client.close()
    env = dict(os.environ)
    for stale in ("TURNSTILE_FENCING_TOKEN", "TURNSTILE_LIMIT"):  # an enclosing run's
        env.pop(stale, None)
    env.update(
        TURNSTILE_NAME=name,
        TURNSTILE_HOLDER=holder,
        TURNSTILE_ADMITTED_AT=repr(admitted_at),
    )
    return _exec(command, env)


def _reason(exc: AcquireTimeout, name: str) -> str:
    text = str(exc)
    prefix = f"{name!r}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def _exec(command: list[str], env: dict[str, str]) -> int:
    """Replace this process with CMD; only returns (an exit code) if it cannot start."""
    for signum in RESET_FOR_CHILD:  # Python ignores them; CMD gets the defaults back
        signal.signal(signum, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        _support.error(f"command not found: {_support.printable(command[0])}")
        return EXIT_NOT_FOUND
    except OSError as exc:
        _support.error(
            f"cannot execute {_support.printable(command[0])}: {exc.strerror or exc}"
        )
        return EXIT_CANNOT_EXECUTE
    finally:
        for signum in RESET_FOR_CHILD:
            signal.signal(signum, signal.SIG_IGN)
    return EXIT_CANNOT_EXECUTE  # not reached: execvpe returns only by raising


def _timeout_message(sem: Semaphore, shown: str, timeout: float | None) -> str:
    message = f"timed out after {validate.seconds_text(timeout or 0.0)} waiting for {shown}"
    try:
        status = sem.status()
    except Exception:  # the message is best effort; the exit code says it all
        return message
    if status.holders:
        holders = ", ".join(_support.printable(h.holder) for h in status.holders[:3])
        more = f" and {len(status.holders) - 3} more" if len(status.holders) > 3 else ""
        message += f" (held by {holders}{more}"
        message += f"; {len(status.waiters)} waiting)" if status.waiters else ")"
    return message


class _LostAlarm:
    """The lease's ``on_lost`` callback: remembers the loss and wakes the supervisor,
    which sleeps in ``sigwaitinfo`` (woken by a SIGCHLD aimed at its thread)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.wake_thread: int | None = None

    def __call__(self, lease: Lease) -> None:
        self.event.set()
        ident = self.wake_thread
        if ident is not None:
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(ident, signal.SIGCHLD)


class _Ticker:
    """Sends SIGCHLD to the supervising thread every :data:`TICK` seconds: a bound on how
    long anything can go unnoticed (a signal that landed on a thread started before ours
    blocked it, the --kill-after deadline, a lease that lapsed)."""

    def __init__(self, target: int) -> None:
        self._target = target
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="turnstile-run-tick", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(TICK):
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(self._target, signal.SIGCHLD)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


class _Child:
    """CMD, started with ``posix_spawnp`` so it can get a clean signal mask while we keep
    ours blocked."""

    def __init__(
        self, argv: list[str], env: dict[str, str], sigmask: set[int | signal.Signals]
    ) -> None:
        self.pid = os.posix_spawnp(
            argv[0], argv, env, setsigmask=sigmask, setsigdef=RESET_FOR_CHILD
        )
        self.code: int | None = None

    def poll(self) -> int | None:
        if self.code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # someone set SIGCHLD to SIG_IGN: exit code unknown
                self.code = 255
                return self.code
            if pid:
                code = os.waitstatus_to_exitcode(status)
                self.code = EXIT_SIGNAL_BASE - code if code < 0 else code
        return self.code

    def send(self, signum: int) -> None:
        # Only while not yet reaped: a zombie keeps its pid, so it cannot have been reused.
        if self.code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


class _Supervisor:
    def __init__(
        self,
        lease: Lease,
        command: list[str],
        env: dict[str, str],
        args: argparse.Namespace,
        shown: str,
        alarm: _LostAlarm,
    ) -> None:
        self.lease = lease
        self.command = command
        self.env = env
        self.on_lost: str = args.on_lost
        self.kill_after: float = args.kill_after
        self.lost_exit_code: int = args.lost_exit_code
        self.shown = shown
        self.alarm = alarm
        self.child: _Child | None = None
        self.lost_at: float | None = None
        self.kill_at: float | None = None

    def run(self) -> int:
        waitset: set[signal.Signals] = {*FORWARDED, signal.SIGCHLD} if _SIGWAIT else set()
        old_mask: set[int | signal.Signals] = set()
        code = EXIT_FAILURE
        ticker: _Ticker | None = None
        if _SIGWAIT:
            # Blocked before the renewer thread starts, so it inherits the mask and every
            # such signal reaches sigwaitinfo in this thread (pending ones too, once CMD runs).
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, waitset)
            self.alarm.wake_thread = threading.get_ident()
            ticker = _Ticker(threading.get_ident())
        # Fallback path (and, with sigwaitinfo, signals that land on a thread started
        # before we blocked them): a handler that forwards. Ignored signals stay ignored.
        previous = {s: signal.getsignal(s) for s in FORWARDED}
        for signum in FORWARDED:
            if previous[signum] != signal.SIG_IGN:
                signal.signal(signum, self._forward_handler)
        try:
            try:
                with self.lease:  # renews every ttl/3 until the block ends, then releases
                    try:
                        self.child = _Child(self.command, self.env, old_mask)
                    except FileNotFoundError:
                        _support.error(f"command not found: {_support.printable(self.command[0])}")
                        return EXIT_NOT_FOUND
                    except OSError as exc:
                        _support.error(
                            f"cannot execute {_support.printable(self.command[0])}: "
                            f"{exc.strerror or exc}"
                        )
                        return EXIT_CANNOT_EXECUTE
                    code = self._wait(waitset)
            except LeaseLost:
                self._lost()  # noticed only as the block ended
            except BackendUnavailable as exc:
                _support.note(
                    f"warning: could not release {self.shown} ({exc}); "
                    f"it expires by itself within {validate.seconds_text(self.lease.ttl)}"
                )
        finally:
            self.alarm.wake_thread = None
            if ticker is not None:
                ticker.stop()
            if _SIGWAIT:
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)
        if self.lost_at is not None:
            _support.error(
                f"exiting with {self.lost_exit_code}: the lease was lost while the command "
                f"ran (it exited with {code})"
            )
            return self.lost_exit_code
        return code

    def _forward_handler(self, signum: int, frame: FrameType | None) -> None:
        if self.child is not None:
            self.child.send(signum)

    def _lost(self) -> None:
        if self.lost_at is not None:
            return
        self.lost_at = time.monotonic()
        action = (
            "sending the command SIGTERM" if self.on_lost == "terminate" else "letting it finish"
        )
        _support.error(
            f"lost the lease on {self.shown} (token {self.lease.token}) while the command "
            f"ran: it expired or was taken over, so another holder may run now; {action}"
        )
        if self.on_lost == "terminate" and self.child is not None:
            self.child.send(signal.SIGTERM)
            self.kill_at = time.monotonic() + self.kill_after

    def _wait(self, waitset: set[signal.Signals]) -> int:
        child = self.child
        assert child is not None
        while True:
            code = child.poll()
            if code is not None:
                return code
            if self.lost_at is None and (self.alarm.event.is_set() or self.lease.lost):
                self._lost()
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                child.send(signal.SIGKILL)
                self.kill_at = None
            if not _SIGWAIT:
                time.sleep(TICK / 10)  # signal handlers forward meanwhile
                continue
            # Woken by: CMD's exit (SIGCHLD), a signal for CMD, the lost-lease alarm and the
            # ticker (both send SIGCHLD to this thread). Not sigtimedwait: after EINTR (e.g.
            # SIGSTOP/SIGCONT) at its deadline, CPython 3.11 returns an uninitialised siginfo.
            info = signal.sigwaitinfo(waitset)
            if info.si_signo not in FORWARDED:
                continue
            if _LINUX and info.si_code == SI_KERNEL:
                continue  # from the terminal to the whole foreground group: CMD has it
            child.send(info.si_signo)
