"""`turnstile run --group NAME --key K --per-key N --total N`: runs of one key wait for each
other while other keys go ahead; the command sees its key; bad combinations are refused.
Real processes against a SQLite file of the test's own."""

from __future__ import annotations

import json

import pytest

import turnstile

from ._invoke import py, run, spawn, stderr_of, wait_until

pytestmark = pytest.mark.timeout(120)

GROUP = ["--group", "db", "--per-key", "1", "--total", "2"]


def waiting(url: str) -> list[str]:
    with turnstile.connect(url) as client:
        return [w.holder for w in client.status("db").waiters]


def test_a_busy_key_waits_while_another_key_runs(url: str) -> None:
    with turnstile.connect(url) as client:
        group = client.semaphore_group("db", per_key=1, total=2, ttl=60)
        held = group.acquire("tenant-a", timeout=10, holder="held")
        blocked = spawn("run", "--url", url, *GROUP, "--key", "tenant-a", "--holder", "a2",
                        "--", "true")
        wait_until(lambda: waiting(url) == ["a2"], what="a2 in line")
        # tenant-b is not held up by a2 in front of it.
        other = run("run", "--url", url, *GROUP, "--key", "tenant-b", "--timeout", "10", "--",
                    *py("import json, os; print(json.dumps({k: v for k, v in "
                        "os.environ.items() if k.startswith('TURNSTILE_')}))"))
        assert other.returncode == 0, other.stderr
        env = json.loads(other.stdout)
        assert (env["TURNSTILE_NAME"], env["TURNSTILE_KEY"], env["TURNSTILE_LIMIT"]) == (
            "db", "tenant-b", "2"
        )
        assert blocked.poll() is None
        held.release()
    assert blocked.wait(60) == 0, stderr_of(blocked)


def test_a_timeout_names_the_group_and_key(url: str) -> None:
    with turnstile.connect(url) as client:
        client.semaphore_group("db", 1, 2, ttl=60).acquire("k", timeout=10, holder="held")
        late = run("run", "--url", url, *GROUP, "--key", "k", "--timeout", "0", "--", "true")
    assert late.returncode == 75
    assert "waiting for group 'db' key 'k' (held by held)" in late.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--group", "db", "--key", "k", "--per-key", "1"], "--group needs --total"),
        (["--group", "db", "--total", "2"], "--group needs --key, --per-key"),
        ([*GROUP, "--key", "k", "--limit", "3"], "--limit does not apply to --group"),
        ([*GROUP, "--key", ""], "--key must be 1 to 1024 bytes"),
        (["--lock", "x", "--key", "k"], "--key applies only to --group"),
        (["--semaphore", "x", "--limit", "2", "--total", "3"], "--total applies only to --group"),
        ([*GROUP[:2], "--key", "k", "--per-key", "0", "--total", "2"],
         "argument --per-key: must be between 1 and 1000000, got 0"),
    ],
)
def test_bad_group_options_are_refused(url: str, args: list[str], words: str) -> None:
    result = run("run", "--url", url, *args, "--", "true")
    assert result.returncode == 2
    assert words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_status_shows_the_keys(url: str) -> None:
    with turnstile.connect(url) as client:
        group = client.semaphore_group("db", per_key=1, total=2, ttl=60)
        group.acquire("tenant-a", timeout=10, holder="a1")
        group.try_acquire("tenant-a", "a2", wait_ttl=60)
    shown = run("status", "--url", url, "db")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "db: 1/2 held (group: 1 per key), 1 waiting"
    assert lines[1].split() == ["HOLDER", "KEY", "TOKEN", "AGE", "EXPIRES", "IN"]
    assert lines[2].split()[:2] == ["a1", "tenant-a"]
    assert lines[3].split() == ["POSITION", "WAITER", "KEY", "WAITING"]
    assert lines[4].split()[:3] == ["0", "a2", "tenant-a"]
