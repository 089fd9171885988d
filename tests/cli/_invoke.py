"""Run the real command line in subprocesses: ``sys.executable -m turnstile …``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import turnstile

# The supervisor of `turnstile run` has two paths: sigwaitinfo (Linux) and plain signal
# handlers (platforms without it). "handlers" forces the second one here.
HANDLERS_PRELUDE = (
    "import sys, turnstile.cli.run as r; r._SIGWAIT = False; "
    "from turnstile.cli import main; sys.exit(main(sys.argv[1:]))"
)
# The race every blocking wait has: a signal that trips Python's handler just as the main
# thread goes into a blocking call (or that the kernel hands to another thread) is seen
# only when that call returns. Made certain here: the main thread blocks the stopping
# signals, so the kernel hands them to a thread that only sleeps.
SIGNALS_ELSEWHERE_PRELUDE = (
    "import signal, sys, threading, time; "
    "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start(); "
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}); "
    "from turnstile.cli import main; sys.exit(main(sys.argv[1:]))"
)


# The signals `turnstile run` forwards. A suite started in the background of a
# non-interactive shell inherits SIGINT and SIGQUIT ignored, one started under nohup SIGHUP
# ignored; `turnstile run` keeps ignored signals ignored (it must: that is how nohup works),
# so the commands under test start with the defaults, as from a terminal.
DEFAULTED_SIGNALS = tuple(
    getattr(signal, n)
    for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, n)
)


def default_signals() -> None:
    """In a child before it execs: the default action for every signal under test."""
    for signum in DEFAULTED_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def command(args: Sequence[str], supervisor: str = "sigwaitinfo") -> list[str]:
    if supervisor == "handlers":
        return [sys.executable, "-c", HANDLERS_PRELUDE, *args]
    if supervisor == "signals-elsewhere":
        return [sys.executable, "-c", SIGNALS_ELSEWHERE_PRELUDE, *args]
    return [sys.executable, "-m", "turnstile", *args]


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a hung command shows its stacks on SIGABRT
    env.update(extra or {})
    return env


def run(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
    supervisor: str = "sigwaitinfo",
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(args, supervisor),
        env=environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        preexec_fn=default_signals,
    )


def spawn(
    *args: str,
    env: dict[str, str] | None = None,
    supervisor: str = "sigwaitinfo",
    stdout: int | None = subprocess.PIPE,
    start_new_session: bool = False,
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command(args, supervisor),
        env=environment(env),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=start_new_session,
        preexec_fn=default_signals,
    )


def stderr_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    return proc.stderr.read()


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")


def status(url: str, name: str) -> turnstile.Status:
    with turnstile.connect(url) as client:
        return client.status(name)


def holders(url: str, name: str) -> list[str]:
    return [h.holder for h in status(url, name).holders]


def waiters(url: str, name: str) -> list[str]:
    return [w.holder for w in status(url, name).waiters]


def py(code: str) -> list[str]:
    """A child command: this Python running ``code``."""
    return [sys.executable, "-c", code]
