"""Blocking calls of the workflow services (turnstile/workflows/threads.py) never hold up
the process's exit: a bridge, dispatcher or deliverer told to stop abandons a call still in
flight instead of waiting out its timeouts."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from turnstile.workflows import threads

ROOT = Path(__file__).resolve().parents[2]


async def test_a_call_gives_its_result_or_its_exception() -> None:
    assert await threads.call(lambda a, b=0: a + b, 2, b=3) == 5

    def fails() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await threads.call(fails)


def _exits_promptly(script: str, tmp_path: Path) -> str:
    """Run ``script``; it must exit 0 well before the blocking call it abandons returns
    (which is never: it waits on an event nobody sets)."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,  # a process that waits for the call would be killed here
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert took < 45, f"the process took {took:.1f} s to exit"
    return proc.stdout


def test_an_abandoned_call_does_not_hold_up_the_exit(tmp_path: Path) -> None:
    out = _exits_promptly(
        """
        import asyncio, threading
        from turnstile.workflows import threads

        async def main():
            forever = threading.Event()
            try:
                await asyncio.wait_for(threads.call(forever.wait), 0.2)
            except asyncio.TimeoutError:
                print("abandoned")

        asyncio.run(main())
        """,
        tmp_path,
    )
    assert out.split() == ["abandoned"]


def test_a_stopping_deliverer_abandons_a_hanging_send(tmp_path: Path) -> None:
    """A send that never returns (an endpoint that hangs past every timeout): stop() gives
    it STOP_GRACE, leaves the delivery unsettled (its claim lapses; another deliverer sends
    it again) and the process exits."""
    out = _exits_promptly(
        """
        import asyncio, sys, threading, time
        import turnstile.aio
        from turnstile._core.callbacks import StepFunctionsCallback
        from turnstile.workflows.deliverer import STOP_GRACE, Deliverer

        async def main():
            client = await turnstile.aio.connect(f"sqlite:///{sys.argv[1]}/d.db")
            called, forever = threading.Event(), threading.Event()

            def sender(delivery, callback, body):
                called.set()
                forever.wait()

            sem = client.semaphore("hang", 1, ttl=60)
            await sem.try_acquire("a", callback=StepFunctionsCallback("task-token-" + "x" * 40))
            deliverer = Deliverer(client.backend, sender=sender, interval=0.02)
            await deliverer.start()
            await asyncio.to_thread(called.wait, 30)
            started = time.monotonic()
            await deliverer.stop()
            took = time.monotonic() - started
            status = await sem.status()
            print(called.is_set(), took < STOP_GRACE + 5, [h.delivery for h in status.holders])
            await client.close()

        asyncio.run(main())
        """,
        tmp_path,
    )
    assert out.split() == ["True", "True", "['pending']"]


@pytest.mark.parametrize("module", ["bridge", "deliverer", "dispatcher", "reconciler"])
def test_the_workflow_services_make_no_call_the_exit_waits_for(module: str) -> None:
    """Every blocking call of these services goes through threads.call: none through
    asyncio.to_thread or an executor, whose threads the exit waits for."""
    source = (ROOT / "src" / "turnstile" / "workflows" / f"{module}.py").read_text()
    for pattern in ("to_thread(", "run_in_executor(", "ThreadPoolExecutor"):
        assert pattern not in source, f"{module}.py uses {pattern}"


def test_the_helper_is_usable_outside_a_service() -> None:
    assert asyncio.run(threads.call(int, "7")) == 7
