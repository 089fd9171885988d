"""`turnstile limit NAME N`: change a name's limit; `turnstile run` naming another limit
than a busy name's is refused (exit 2) with the way to change it."""

from __future__ import annotations

import json

import pytest

import turnstile

from ._invoke import run

pytestmark = pytest.mark.timeout(120)


def test_limit_changes_a_busy_names_limit_and_run_is_refused_until_then(url: str) -> None:
    client = turnstile.connect(url)
    try:
        sem = client.semaphore("gpu", 1, ttl=60)
        held = sem.acquire(timeout=5, holder="trainer")
        assert sem.try_acquire("next", 60).position == 0

        refused = run("run", "--url", url, "--semaphore", "gpu", "--limit", "2", "--", "true")
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith("turnstile: error: 'gpu' has limit 1"), refused.stderr
        # in the command's own words: its flags, and the command that changes the limit
        assert "--limit 2 asks for another" in refused.stderr
        assert "use --semaphore 'gpu' --limit 1, or change it with: turnstile limit 'gpu' 2" in (
            refused.stderr
        )
        assert "set_limit" not in refused.stderr and refused.stderr.count("\n") == 1
        # --lock asks for limit 1, the name's: not refused, it waits its turn (and times out)
        as_lock = run("run", "--url", url, "--lock", "gpu", "--timeout", "0.2", "--", "true")
        assert as_lock.returncode == 75, as_lock.stderr

        changed = run("limit", "--url", url, "gpu", "2")
        assert changed.returncode == 0, changed.stderr
        assert changed.stdout.strip() == "gpu: limit 1 -> 2"
        # the raised limit granted the waiter at once
        assert [h.holder for h in sem.status().holders] == ["trainer", "next"]
        assert sem.status().limit == 2

        again = run("limit", "--url", url, "gpu", "2", "--json")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout) == {"name": "gpu", "limit": 2, "previous": 2}

        # now `run` with the name's limit waits its turn like anyone (it is not refused)
        lowered = run("limit", "--url", url, "gpu", "1")
        assert lowered.stdout.strip() == "gpu: limit 2 -> 1"
        assert len(sem.status().holders) == 2  # nothing revoked
        assert held.release() and sem.release("next")
    finally:
        client.close()


def test_limit_on_an_idle_name_and_bad_arguments(url: str) -> None:
    idle = run("limit", "--url", url, "free", "3")
    assert idle.returncode == 0, idle.stderr
    assert "free: idle" in idle.stdout and "nothing to change" in idle.stdout
    as_json = run("limit", "--url", url, "free", "3", "--json")
    assert json.loads(as_json.stdout) == {"name": "free", "limit": 3, "previous": None}
    for bad in ("0", "1000001", "two"):
        result = run("limit", "--url", url, "free", bad)
        assert result.returncode == 2
        assert "N" in result.stderr and "Traceback" not in result.stderr
    assert "turnstile limit" in run("--help").stdout
