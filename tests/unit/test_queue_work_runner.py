"""``turnstile queue work``'s runner counts a command as running from before its start.

A command can be running (its first line done) while the worker thread that started it has
not yet registered it: a busy machine can hold that thread back for long. A drain that came
then said "waiting for 1 running command(s)" with 2 running (seen in CI). Here the thread is
held at exactly that point and the count is read."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import turnstile
from turnstile.cli import queue_work


def test_a_command_not_yet_registered_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold = threading.Event()
    real_popen = subprocess.Popen

    def popen_then_wait(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        child = real_popen(*args, **kwargs)
        hold.wait(60)  # the worker thread, held back after the start, before registering
        return child

    monkeypatch.setattr(queue_work.subprocess, "Popen", popen_then_wait)
    script = f'touch "{tmp_path}/started"; while [ ! -e "{tmp_path}/go" ]; do sleep 0.02; done'
    runner = queue_work._Runner(["sh", "-c", script], "jobs", verbose=False)
    with turnstile.connect(f"sqlite:///{tmp_path}/q.db") as client:
        q = client.queue("jobs")
        q.put("one")
        message = q.get(timeout=0)
        assert message is not None
        worker = threading.Thread(target=runner, args=(message,))
        assert runner.running() == 0
        worker.start()
        try:
            deadline = time.monotonic() + 60
            while not (tmp_path / "started").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert (tmp_path / "started").exists()
            assert runner.running() == 1  # started, not registered yet: counted
        finally:
            hold.set()
            (tmp_path / "go").touch()
            worker.join(60)
        assert not worker.is_alive()
        assert runner.running() == 0
        message.ack()
