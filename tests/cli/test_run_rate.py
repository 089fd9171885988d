"""`turnstile run --rate-limit NAME --rate N/UNIT`: wait in line to be admitted, then run the
command in turnstile's place. Real processes against a SQLite file of the test's own."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
from pathlib import Path

import pytest

import turnstile
from turnstile._core.rate_machine import max_in_window
from turnstile.cli.run import rate_type

from ._invoke import py, run, spawn, stderr_of, wait_until

pytestmark = pytest.mark.timeout(120)

SHOW_ENV = py(
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith('TURNSTILE_')}))"
)


def rate_waiters(url: str, name: str) -> list[str]:
    with turnstile.connect(url) as client:
        return [w.holder for w in client.backend.rate_status(name).waiters]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10/s", (10, 1.0)),
        ("30/m", (30, 60.0)),
        ("1000/h", (1000, 3600.0)),
        ("5/2.5", (5, 2.5)),
        ("100/15m", (100, 900.0)),
        ("1/0.5s", (1, 0.5)),
        ("7/ S ", (7, 1.0)),
    ],
)
def test_rates_are_n_per_unit(text: str, expected: tuple[int, float]) -> None:
    assert rate_type("--rate")(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("10", "must be N/UNIT"),
        ("10/x", "must be N/UNIT"),
        ("ten/s", "must be N/UNIT"),
        ("-1/s", "must be N/UNIT"),
        ("0/s", "rate must be between 1 and 1000000"),
        ("1/0", "per must be between 0.001"),
        ("1/31d", "must be N/UNIT"),
        ("1/2592001", "per must be between"),
    ],
)
def test_bad_rates_are_refused(text: str, words: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=words):
        rate_type("--rate")(text)


@pytest.mark.parametrize("code", [0, 3])
def test_the_command_runs_in_turnstiles_place_with_its_exit_code(url: str, code: int) -> None:
    result = run(
        "run", "--url", url, "--rate-limit", "api", "--rate", "10/s", "--holder", "me", "--",
        *py(f"import json, os, sys; print(json.dumps(dict(os.environ))); sys.exit({code})"),
        env={"TURNSTILE_FENCING_TOKEN": "7", "TURNSTILE_LIMIT": "3"},  # an enclosing run's
    )
    assert result.returncode == code, result.stderr
    assert result.stderr == ""
    env = json.loads(result.stdout)
    assert (env["TURNSTILE_NAME"], env["TURNSTILE_HOLDER"]) == ("api", "me")
    assert float(env["TURNSTILE_ADMITTED_AT"]) > 0
    assert "TURNSTILE_FENCING_TOKEN" not in env and "TURNSTILE_LIMIT" not in env


def test_runs_are_admitted_at_the_rate_in_line(url: str, tmp_path: Path) -> None:
    rate, burst = 10, 2
    log = tmp_path / "admitted"
    record = py(
        "import os, sys; open(sys.argv[1], 'a').write(os.environ['TURNSTILE_ADMITTED_AT'] "
        "+ '\\n')"
    )
    procs = [
        spawn("run", "--url", url, "--rate-limit", "batch", "--rate", f"{rate}/s", "--burst",
              str(burst), "--timeout", "30", "--", *record, str(log))
        for _ in range(8)
    ]
    for proc in procs:
        assert proc.wait(60) == 0, stderr_of(proc)
    times = sorted(float(t) for t in log.read_text().split())
    assert len(times) == 8
    assert max_in_window(times, 1e-9) <= burst
    # 8 admissions: 2 at once, then one every 0.1 s (by the store's clock).
    assert times[-1] - times[0] >= (8 - burst) * 0.1 - 1e-6


def test_a_slot_past_the_timeout_exits_75_at_once_and_leaves_the_line(url: str) -> None:
    first = run("run", "--url", url, "--rate-limit", "slow", "--rate", "1/m", "--", "true")
    assert first.returncode == 0, first.stderr
    late = run("run", "--url", url, "--rate-limit", "slow", "--rate", "1/m", "--timeout", "5",
               "--", "true", timeout=20)
    assert late.returncode == 75
    assert "turnstile: error: not admitted by rate limit 'slow' within 5 seconds: the next " \
        "slot for this caller is" in late.stderr
    assert "past the timeout" in late.stderr
    assert rate_waiters(url, "slow") == []
    custom = run("run", "--url", url, "--rate-limit", "slow", "--rate", "1/m", "--timeout", "0",
                 "--timeout-exit-code", "9", "--", "true")
    assert custom.returncode == 9


@pytest.mark.parametrize(
    ("signum", "supervisor"),
    [
        (signal.SIGTERM, "sigwaitinfo"),
        (signal.SIGINT, "sigwaitinfo"),
        # The signal trips the handler while the main thread sleeps in line (a minute here):
        # the run must still stop at once, not at its turn.
        (signal.SIGTERM, "signals-elsewhere"),
        (signal.SIGINT, "signals-elsewhere"),
    ],
    ids=["SIGTERM", "SIGINT", "SIGTERM-elsewhere", "SIGINT-elsewhere"],
)
def test_a_signal_while_waiting_leaves_the_line(
    url: str, signum: signal.Signals, supervisor: str
) -> None:
    assert run("run", "--url", url, "--rate-limit", "sig", "--rate", "1/m", "--", "true")\
        .returncode == 0
    proc = spawn("run", "--url", url, "--rate-limit", "sig", "--rate", "1/m", "--holder",
                 "waiting", "--", "true", supervisor=supervisor)
    wait_until(lambda: rate_waiters(url, "sig") == ["waiting"], what="the run waits in line")
    os.kill(proc.pid, signum)
    assert proc.wait(30) == 128 + signum, stderr_of(proc)
    assert rate_waiters(url, "sig") == []


def test_a_missing_command_is_127(url: str) -> None:
    result = run("run", "--url", url, "--rate-limit", "x", "--rate", "5/s", "--",
                 "no-such-command-turnstile")
    assert result.returncode == 127
    assert "command not found: no-such-command-turnstile" in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--rate-limit", "x"], "--rate-limit needs --rate N/UNIT"),
        (["--rate-limit", "x", "--rate", "1/q"], "argument --rate: must be N/UNIT"),
        (["--rate-limit", "x", "--rate", "5/s", "--burst", "0"], "argument --burst"),
        (["--rate-limit", "x", "--rate", "5/s", "--limit", "2"], "--limit does not apply"),
        (["--rate-limit", "x", "--rate", "5/s", "--ttl", "5"], "--ttl does not apply"),
        (["--lock", "x", "--rate", "5/s"], "--rate applies only to --rate-limit and --semaphore"),
        (["--semaphore", "x", "--limit", "2", "--burst", "2"], "--burst goes with --rate"),
        (["--group", "g", "--key", "k", "--per-key", "1", "--total", "2", "--rate", "5/s"],
         "--rate applies only to --rate-limit and --semaphore"),
        (["--lock", "x", "--rate-limit", "y", "--rate", "5/s"], "not allowed with argument"),
    ],
)
def test_bad_arguments_exit_2(url: str, args: list[str], words: str) -> None:
    result = run("run", "--url", url, *args, "--", "true")
    assert result.returncode == 2, result.stderr
    assert words in result.stderr


def test_another_rate_on_a_busy_name_is_refused(url: str) -> None:
    assert run("run", "--url", url, "--rate-limit", "one", "--rate", "1/m", "--", "true")\
        .returncode == 0
    other = run("run", "--url", url, "--rate-limit", "one", "--rate", "2/m", "--", "true")
    assert other.returncode == 2
    assert "is a rate limit of rate=1 per=60 burst=1 while it is in use" in other.stderr


def test_status_shows_a_rate_limit(url: str) -> None:
    idle = run("status", "--url", url, "--rate-limit", "api")
    assert idle.returncode == 0, idle.stderr
    assert idle.stdout.strip() == "api: idle rate limit (nobody waits, no admission in its " \
        "last period)"
    with turnstile.connect(url) as client:
        limiter = client.rate_limit("api", 30, 60, burst=2)
        for holder in ("a", "b", "c", "d"):
            limiter.try_acquire(holder)
    text = run("status", "--url", url, "--rate-limit", "api")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "api: rate limit 30 per 60 s, burst 2; 2 admitted in the last 60 s, " \
        "2 waiting"
    assert lines[1].split() == ["POSITION", "WAITER", "WAITING", "DUE", "IN"]
    assert [line.split()[:2] for line in lines[2:]] == [["0", "c"], ["1", "d"]]
    data = json.loads(run("status", "--url", url, "--rate-limit", "api", "--json").stdout)
    assert (data["rate"], data["per"], data["burst"]) == (30, 60.0, 2)
    assert [w["holder"] for w in data["waiters"]] == ["c", "d"] and len(data["admitted"]) == 2
    both = run("status", "--url", url, "--rate-limit", "api", "deploy")
    assert both.returncode == 2 and "--rate-limit takes no NAME or --prefix" in both.stderr


def test_a_semaphore_with_a_start_rate(url: str, tmp_path: Path) -> None:
    """`--semaphore NAME --limit N --rate R/UNIT`: at most N at once, and starts spaced by
    the rate (store clock, given to the command as TURNSTILE_STARTED_AT)."""
    log = tmp_path / "started"
    record = py("import os, sys, time; open(sys.argv[1], 'a').write(os.environ["
                "'TURNSTILE_STARTED_AT'] + '\\n'); time.sleep(0.05)")
    procs = [
        spawn("run", "--url", url, "--semaphore", "jobs", "--limit", "2", "--rate", "10/s",
              "--holder", f"h{i}", "--timeout", "60", "--", *record, str(log))
        for i in range(5)
    ]
    for proc in procs:
        assert proc.wait(60) == 0, stderr_of(proc)
    starts = sorted(float(t) for t in log.read_text().split())
    assert len(starts) == 5
    # One start every 0.1 s (burst 1), by the store's clock.
    assert all(b - a >= 0.1 - 1e-6 for a, b in itertools.pairwise(starts))
