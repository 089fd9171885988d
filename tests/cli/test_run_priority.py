"""`turnstile run --priority K [--ageing S]`: runs waiting on one lock start by priority,
in arrival order within a level; bad values are refused by name. Real processes against a
SQLite file of the test's own."""

from __future__ import annotations

from pathlib import Path

import pytest

import turnstile

from ._invoke import py, run, spawn, stderr_of, wait_until

pytestmark = pytest.mark.timeout(120)


def waiting(url: str, name: str) -> list[str]:
    with turnstile.connect(url) as client:
        return [w.holder for w in client.status(name).waiters]


def test_waiting_runs_start_by_priority(url: str, tmp_path: Path) -> None:
    log = tmp_path / "ran"
    record = py("import os, sys; open(sys.argv[1], 'a').write(os.environ['TURNSTILE_HOLDER'] "
                "+ '\\n')")
    plan = [("low", "0"), ("high", "5"), ("low2", "0"), ("mid", "2")]
    with turnstile.connect(url) as client:
        held = client.lock("deploy", ttl=60).acquire(timeout=10, holder="held")
        procs = []
        for holder, priority in plan:
            procs.append(spawn("run", "--url", url, "--lock", "deploy", "--holder", holder,
                               "--priority", priority, "--ageing", "600", "--", *record,
                               str(log)))
            wait_until(lambda h=holder: h in waiting(url, "deploy"), what=f"{holder} in line")
        assert waiting(url, "deploy") == ["high", "mid", "low", "low2"]
        held.release()
    for proc in procs:
        assert proc.wait(60) == 0, stderr_of(proc)
    assert log.read_text().split() == ["high", "mid", "low", "low2"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--priority", "1001"], "argument --priority: must be between -1000 and 1000"),
        (["--priority", "x"], "argument --priority"),
        (["--ageing", "0"], "argument --ageing: must be between 0.01 and 2592000 seconds"),
        (["--ageing", "nan"], "argument --ageing"),
    ],
)
def test_bad_priorities_are_refused(url: str, args: list[str], words: str) -> None:
    result = run("run", "--url", url, "--lock", "x", *args, "--", "true")
    assert result.returncode == 2
    assert words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
