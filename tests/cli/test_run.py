"""`turnstile run`: exit codes, timeouts, semaphore bounds, signals and lost leases, all with
real processes against a SQLite file of the test's own."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import turnstile

from ._invoke import default_signals, holders, py, run, spawn, stderr_of, wait_until, waiters

pytestmark = pytest.mark.timeout(120)

SUPERVISORS = ["sigwaitinfo", "handlers"]

# How long a `turnstile run` may take to wind up (forward a signal, reap its command, release,
# exit). Milliseconds when idle; generous, so that a loaded machine cannot fail a test.
EXIT_WAIT = 60.0

# A child that reports SIGTERM/SIGINT in a file and exits 7; "ready" on stdout once set up.
TRAPPING_CHILD = """
import signal, sys, time
marker = sys.argv[1]
def stop(signum, frame):
    with open(marker, "a") as f:
        f.write(signal.Signals(signum).name + "\\n")
    sys.exit(7)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print("ready", flush=True)
# In slices: a handler runs between Python steps, so a signal that landed just before one
# long sleep's system call began would wait for the whole sleep.
for _ in range(600):
    time.sleep(0.1)
sys.exit(0)
"""


SLEEPER = py("import time; print('ready', flush=True); time.sleep(60)")


def _holding(
    url: str,
    name: str,
    *extra: str,
    child: list[str] | None = None,
    supervisor: str = "sigwaitinfo",
) -> subprocess.Popen[str]:
    """Start `turnstile run --lock name … -- child` and return once the child runs (the
    child prints "ready")."""
    cmd = child or SLEEPER
    proc = spawn("run", "--url", url, "--lock", name, *extra, "--", *cmd, supervisor=supervisor)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", (line, stderr_of(proc) if proc.poll() is not None else "")
    return proc


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"turnstile {turnstile.__version__}"


@pytest.mark.parametrize("supervisor", SUPERVISORS)
@pytest.mark.parametrize("code", [0, 3, 42])
def test_run_passes_the_exit_code_through(url: str, code: int, supervisor: str) -> None:
    result = run(
        "run",
        "--url",
        url,
        "--lock",
        "job",
        "--",
        *py(f"import sys; sys.exit({code})"),
        supervisor=supervisor,
    )
    assert result.returncode == code, result.stderr
    assert result.stderr == ""
    assert holders(url, "job") == []  # released afterwards


def test_run_exit_code_of_a_killed_command_is_128_plus_signal(url: str) -> None:
    result = run(
        "run",
        "--url",
        url,
        "--lock",
        "job",
        "--",
        *py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
    )
    assert result.returncode == 128 + signal.SIGKILL


def test_command_sees_name_holder_and_increasing_tokens(url: str) -> None:
    show = py(
        "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith('TURNSTILE_')}))"
    )
    first = run("run", "--url", url, "--lock", "deploy x", "--holder", "me", "--", *show)
    second = run("run", "--url", url, "--semaphore", "deploy x", "--limit", "3", "--", *show)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    env1, env2 = json.loads(first.stdout), json.loads(second.stdout)
    assert env1["TURNSTILE_NAME"] == "deploy x"
    assert env1["TURNSTILE_HOLDER"] == "me"
    assert env1["TURNSTILE_LIMIT"] == "1" and env2["TURNSTILE_LIMIT"] == "3"
    assert env2["TURNSTILE_HOLDER"] != "me"  # default: host/pid/random
    assert int(env2["TURNSTILE_FENCING_TOKEN"]) > int(env1["TURNSTILE_FENCING_TOKEN"]) > 0
    assert "TURNSTILE_URL" not in env1  # the URL (maybe with a password) is not handed down


def test_timeout_has_its_own_exit_code_and_leaves_the_line(url: str) -> None:
    holder = _holding(url, "busy", "--holder", "the-holder")
    try:
        started = time.monotonic()
        result = run("run", "--url", url, "--lock", "busy", "--timeout", "0.4", "--", "true")
        waited = time.monotonic() - started
        assert result.returncode == 75, result.stderr
        assert waited >= 0.4
        expected = "timed out after 0.4 seconds waiting for lock 'busy' (held by the-holder)"
        assert expected in result.stderr
        assert result.stderr.count("\n") == 1  # one line
        custom = run(
            "run",
            "--url",
            url,
            "--lock",
            "busy",
            "--timeout",
            "0",
            "--timeout-exit-code",
            "9",
            "--",
            "true",
        )
        assert custom.returncode == 9
        assert waiters(url, "busy") == []  # the timed-out runs left no waiting entry
        assert holders(url, "busy") == ["the-holder"]
    finally:
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(timeout=EXIT_WAIT) == 128 + signal.SIGTERM  # forwarded; child died of it


RECORDER = """
import os, sys, time
out = sys.argv[1]
start = time.time()
time.sleep(float(sys.argv[2]))
end = time.time()
with open(out, "a") as f:
    token, holder = os.environ["TURNSTILE_FENCING_TOKEN"], os.environ["TURNSTILE_HOLDER"]
    f.write(f"{start} {end} {token} {holder}\\n")
"""


@pytest.mark.parametrize(("limit", "runs", "work"), [(1, 4, 0.2), (2, 6, 0.3)])
def test_concurrent_runs_never_exceed_the_limit(
    url: str, tmp_path: Path, limit: int, runs: int, work: float
) -> None:
    out = tmp_path / "intervals.txt"
    target = ["--lock", "shared"]
    if limit > 1:
        target = ["--semaphore", "shared", "--limit", str(limit)]
    procs = [
        spawn("run", "--url", url, *target, "--", *py(RECORDER), str(out), str(work), stdout=None)
        for _ in range(runs)
    ]
    for proc in procs:
        assert proc.wait(timeout=60) == 0, stderr_of(proc) if proc.stderr else ""
    rows = [line.split() for line in out.read_text().splitlines()]
    assert len(rows) == runs
    intervals = [(float(s), float(e)) for s, e, _, _ in rows]
    tokens = [int(t) for _, _, t, _ in rows]
    assert len(set(tokens)) == runs and len({h for *_, h in rows}) == runs
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = most = 0
    for _, delta in events:  # an end sorts before a start at the same instant
        running += delta
        most = max(most, running)
    assert most == limit  # never more than limit, and the limit was actually used
    if limit == 1:  # one at a time: each grant's command started after the previous token's
        by_token = [s for _, s in sorted(zip(tokens, (s for s, _ in intervals), strict=True))]
        assert by_token == sorted(by_token)


@pytest.mark.parametrize("supervisor", SUPERVISORS)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_to_the_command(
    url: str, tmp_path: Path, supervisor: str, signum: int
) -> None:
    marker = tmp_path / "got"
    proc = _holding(
        url,
        "sig",
        "--holder",
        "h",
        child=[*py(TRAPPING_CHILD), str(marker)],
        supervisor=supervisor,
    )
    proc.send_signal(signum)
    assert proc.wait(timeout=EXIT_WAIT) == 7
    assert marker.read_text().split() == [signal.Signals(signum).name]  # once, not twice
    assert holders(url, "sig") == []


@pytest.mark.parametrize("supervisor", SUPERVISORS)
def test_signals_reach_the_command_however_the_suite_was_started(
    url: str, tmp_path: Path, supervisor: str
) -> None:
    """A suite started in the background of a script (SIGINT ignored) or under nohup (SIGHUP
    ignored) passes that on to what it spawns, and `turnstile run` rightly keeps ignored
    signals ignored: the commands under test must start with the defaults (_invoke)."""
    ignored = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGHUP)}
    try:
        marker = tmp_path / "got"
        proc = _holding(url, "ign", child=[*py(TRAPPING_CHILD), str(marker)],
                        supervisor=supervisor)
    finally:
        for signum, handler in ignored.items():
            signal.signal(signum, handler)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=EXIT_WAIT) == 7
    assert marker.read_text().split() == ["SIGINT"]


def test_sighup_kills_an_untrapping_command_and_passes_its_status(url: str) -> None:
    proc = _holding(url, "hup")
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=EXIT_WAIT) == 128 + signal.SIGHUP
    assert holders(url, "hup") == []


def test_ctrl_c_in_a_terminal_reaches_the_command_once(url: str, tmp_path: Path) -> None:
    """The terminal sends SIGINT to the whole foreground group: the command gets it from
    the terminal and turnstile must not send it a second one."""
    marker = tmp_path / "got"
    child = (
        "import signal, sys, time\n"
        "count = 0\n"
        "def h(s, f):\n"
        "    global count; count += 1\n"
        "signal.signal(signal.SIGINT, h)\n"
        "print('ready', flush=True)\n"
        "deadline = time.time() + 10\n"
        "while not count and time.time() < deadline: time.sleep(0.01)\n"
        "time.sleep(0.5)\n"
        f"open({str(marker)!r}, 'w').write(str(count))\n"
        "sys.exit(10 + count)\n"
    )
    argv = [
        sys.executable,
        "-m",
        "turnstile",
        "run",
        "--url",
        url,
        "--lock",
        "tty",
        "--",
        *py(child),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        default_signals()
        os.execve(sys.executable, argv, env)
    output = b""
    try:
        deadline = time.monotonic() + 20
        while b"ready" not in output and time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                output += os.read(master, 1024)
        assert b"ready" in output, output
        os.write(master, b"\x03")  # Ctrl-C
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if select.select([master], [], [], 0.05)[0]:
                with contextlib.suppress(OSError):  # EIO once the terminal's last user exits
                    output += os.read(master, 1024)
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"turnstile did not exit: {output!r}")
    finally:
        os.close(master)
    assert marker.read_text() == "1", output
    assert os.waitstatus_to_exitcode(status) == 11


@pytest.mark.parametrize("supervisor", ["sigwaitinfo", "signals-elsewhere"])
def test_a_signal_while_waiting_leaves_the_line(url: str, supervisor: str) -> None:
    holder = _holding(url, "line", "--holder", "first")
    try:
        waiter = spawn("run", "--url", url, "--lock", "line", "--holder", "second", "--",
                       "true", supervisor=supervisor)
        wait_until(lambda: waiters(url, "line") == ["second"], what="the waiter in line")
        waiter.send_signal(signal.SIGTERM)
        assert waiter.wait(timeout=EXIT_WAIT) == 128 + signal.SIGTERM
        assert "stopped by SIGTERM" in stderr_of(waiter)
        assert waiters(url, "line") == []
        assert holders(url, "line") == ["first"]
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=EXIT_WAIT)


@pytest.mark.parametrize("supervisor", SUPERVISORS)
def test_lease_taken_away_terminates_the_command_with_the_lost_code(
    url: str, tmp_path: Path, supervisor: str
) -> None:
    marker = tmp_path / "got"
    proc = _holding(
        url,
        "lost",
        "--holder",
        "L",
        "--ttl",
        "3",  # renewed every second: it is still held when the operator releases it
        child=[*py(TRAPPING_CHILD), str(marker)],
        supervisor=supervisor,
    )
    with turnstile.connect(url) as client:
        assert client.lock("lost").release(holder="L")  # e.g. an operator's release
    started = time.monotonic()
    assert proc.wait(timeout=EXIT_WAIT) == 79
    # Noticed at a renewal (every second), not when the command ends by itself after 60 s.
    assert time.monotonic() - started < 30
    stderr = stderr_of(proc)
    assert "lost the lease on lock 'lost'" in stderr
    assert "exiting with 79" in stderr and "Traceback" not in stderr
    assert marker.read_text().split() == ["SIGTERM"]


def test_on_lost_wait_lets_the_command_finish(url: str, tmp_path: Path) -> None:
    done = tmp_path / "done"
    proc = _holding(
        url,
        "lost",
        "--holder",
        "L",
        "--ttl",
        "0.6",
        "--on-lost",
        "wait",
        "--lost-exit-code",
        "99",
        child=py(
            # Runs on well after the loss is noticed (at the next renewal, within 0.2 s).
            "import sys, time; print('ready', flush=True); time.sleep(5); "
            f"open({str(done)!r}, 'w').write('x'); sys.exit(4)"
        ),
    )
    with turnstile.connect(url) as client:
        client.lock("lost").release(holder="L")
    assert proc.wait(timeout=EXIT_WAIT) == 99
    assert done.exists()
    assert "it exited with 4" in stderr_of(proc)


def test_paused_past_its_ttl_the_holder_learns_it_lost(url: str, tmp_path: Path) -> None:
    """SIGSTOP the turnstile process past its ttl: another run gets the lock with a larger
    token; after SIGCONT the paused one reports the loss and stops its command."""
    marker = tmp_path / "got"
    show = py("import os; print(os.environ['TURNSTILE_FENCING_TOKEN'])")
    # (2 s: renewed every 0.67 s, it is surely still held when we look at its token.)
    paused = _holding(url, "pause", "--ttl", "2", child=[*py(TRAPPING_CHILD), str(marker)])
    first_token = turnstile.connect(url).status("pause").holders[0].token
    paused.send_signal(signal.SIGSTOP)
    try:
        other = run("run", "--url", url, "--lock", "pause", "--timeout", "30", "--", *show)
        assert other.returncode == 0, other.stderr
        assert int(other.stdout) > first_token
    finally:
        paused.send_signal(signal.SIGCONT)
    assert paused.wait(timeout=EXIT_WAIT) == 79
    assert "lost the lease" in stderr_of(paused)
    assert marker.read_text().split() == ["SIGTERM"]


def test_command_not_found_and_not_executable(url: str, tmp_path: Path) -> None:
    missing = run("run", "--url", url, "--lock", "x", "--", "no-such-command-xyz", "arg")
    assert missing.returncode == 127
    assert missing.stderr.strip() == "turnstile: error: command not found: no-such-command-xyz"
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program")
    denied = run("run", "--url", url, "--lock", "x", "--", str(plain))
    assert denied.returncode == 126
    assert "cannot execute" in denied.stderr
    assert holders(url, "x") == []


BAD_ARGUMENTS = [
    (["--lock", "x", "--ttl", "0"], ["--ttl", "between 0.05 and 2592000 seconds"]),
    (["--lock", "x", "--ttl", "abc"], ["--ttl", "must be a number of seconds"]),
    (["--lock", "x", "--ttl", "nan"], ["--ttl", "NaN"]),
    (["--lock", "x", "--timeout", "-1"], ["--timeout", "between 0 and 2592000 seconds"]),
    (["--lock", "x", "--timeout", "inf"], ["--timeout", "finite"]),
    (["--semaphore", "x", "--limit", "0"], ["--limit", "between 1 and 1000000"]),
    (["--semaphore", "x", "--limit", "2.5"], ["--limit", "integer"]),
    (["--semaphore", "x"], ["--semaphore needs --limit N (1 to 1000000)"]),
    (["--lock", "x", "--limit", "2"], ["--limit applies only to --semaphore"]),
    (["--lock", ""], ["--lock", "must not be empty (1 to 4096 bytes"]),
    (["--lock", "x" * 4097], ["--lock", "1 to 4096 bytes"]),
    (["--lock", "x", "--holder", "h" * 1025], ["--holder", "1 to 1024 bytes"]),
    (["--lock", "x", "--timeout-exit-code", "256"], ["--timeout-exit-code", "0 and 255"]),
    (["--lock", "x", "--lock", "y", "--semaphore", "z"], ["--semaphore", "not allowed with"]),
    ([], ["one of the arguments --lock --semaphore --group --rate-limit is required"]),
]


@pytest.mark.parametrize(("extra", "expected"), BAD_ARGUMENTS)
def test_bad_arguments_exit_2_naming_the_argument(
    url: str, extra: list[str], expected: list[str]
) -> None:
    result = run("run", "--url", url, *extra, "--", "true")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("turnstile run: error: ")
    assert result.stderr.count("\n") == 1, result.stderr  # one line
    for text in expected:
        assert text in result.stderr


def test_missing_command(url: str) -> None:
    for tail in ([], ["--"]):
        result = run("run", "--url", url, "--lock", "x", *tail)
        assert result.returncode == 2
        assert "give the command to run after --" in result.stderr


def test_unknown_url_scheme() -> None:
    result = run("run", "--url", "foo://user:s3cret@host/x", "--lock", "x", "--", "true")
    assert result.returncode == 78
    assert result.stderr.startswith("turnstile: error: unsupported URL scheme 'foo://'")
    assert "supported schemes: memory://, sqlite://" in result.stderr
    assert "s3cret" not in result.stderr and "foo://***@host" in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "secret_url",
    [
        "foo://user:s3cret@127.0.0.1:1/x",
        "postgresql://user:s3cret@127.0.0.1:1/db",
        "redis://:s3cret@127.0.0.1:1/0",
    ],
)
def test_a_password_is_never_printed(secret_url: str) -> None:
    for result in (
        run("status", "--url", secret_url),
        run("status", env={"TURNSTILE_URL": secret_url}),
        run("run", "--url", secret_url, "--lock", "x", "--timeout", "1", "--", "true"),
    ):
        assert result.returncode in (69, 78), result.stderr  # unavailable or not configured
        assert "s3cret" not in result.stderr + result.stdout
        assert "Traceback" not in result.stderr
        assert result.stderr.startswith("turnstile: error: ")


def test_url_comes_from_the_environment_then_the_default(url: str, tmp_path: Path) -> None:
    holding = _holding(url, "env")
    try:
        from_env = run("status", "env", "--json", env={"TURNSTILE_URL": url})
        assert json.loads(from_env.stdout)["holders"], from_env.stderr
        before_command = run("--url", url, "status", "env", "--json")  # also before COMMAND
        assert json.loads(before_command.stdout)["holders"]
    finally:
        holding.send_signal(signal.SIGTERM)
        holding.wait(timeout=EXIT_WAIT)
    # Neither --url nor $TURNSTILE_URL: one file in the XDG state directory, not in the cwd.
    state = tmp_path / "state"
    result = run(
        "run", "--lock", "x", "--", "true", cwd=tmp_path, env={"XDG_STATE_HOME": str(state)}
    )
    assert result.returncode == 0, result.stderr
    assert (state / "turnstile" / "turnstile.db").exists()
    assert not (tmp_path / "turnstile.db").exists()


def test_memory_url_warns_that_nothing_is_shared() -> None:
    result = run("run", "--url", "memory://", "--lock", "x", "--", "true")
    assert result.returncode == 0
    assert "memory:// is private to this process" in result.stderr


def test_no_command_given() -> None:
    result = run()
    assert result.returncode == 2
    commands = (
        "run, status, limit, ask, release, deliver, demo, queue, dispatch, serve, bridge, migrate"
    )
    assert f"choose a command: {commands}" in result.stderr


def test_help_lists_every_command_and_the_exit_codes() -> None:
    result = run("--help")
    assert result.returncode == 0
    for text in ("run", "status", "demo", "75", "79"):
        assert text in result.stdout
    run_help = run("run", "--help")
    assert "TURNSTILE_FENCING_TOKEN" in run_help.stdout and "--timeout-exit-code" in run_help.stdout


def test_python_dash_m_and_the_console_script_agree() -> None:
    script = Path(sys.executable).with_name("turnstile")
    if not script.exists():
        pytest.skip("the console script is not installed next to this Python")
    via_script = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert via_script.returncode == 0
    assert via_script.stdout == run("--version").stdout
