"""`turnstile queue work QUEUE -- CMD`: real worker processes running real commands, on every
store that other processes can share (the memory store is private to one process)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import turnstile
from tests.conftest import BackendUnderTest

from ._invoke import run, spawn, wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def store(backend: BackendUnderTest) -> str:
    if not backend.cross_process:
        pytest.skip("memory:// is private to one process: no other process can put messages")
    return backend.url


@contextlib.contextmanager
def queue(url: str, name: str = "jobs") -> Iterator[turnstile.Queue]:
    with turnstile.connect(url) as client:
        yield client.queue(name)


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def _line_of(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line the worker writes to stderr ('' if none comes within ``timeout``)."""
    stream = proc.stderr
    assert stream is not None
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else ""


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    """The worker's exit code and stderr. One that has not exited in ``timeout`` is sent
    SIGABRT: Python's fault handler (PYTHONFAULTHANDLER, set by ``environment``) prints
    every thread's stack, and the test fails showing where it hung."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"the worker had not exited after {timeout:g} s; its stderr:\n{err}")
    return proc.returncode, err


def test_exit_0_acks_with_payload_on_stdin_and_message_in_env(store: str, tmp_path: Path) -> None:
    with queue(store) as q:
        ids = [
            q.put({"order": 42, "text": "é"}, key="order-42"),
            q.put(b"\x00raw\xff"),
        ]
    script = (
        f'cat > "{tmp_path}/$TURNSTILE_MESSAGE_ID.in"; '
        "env | grep ^TURNSTILE_ | grep -v ^TURNSTILE_URL | sort "
        f'> "{tmp_path}/$TURNSTILE_MESSAGE_ID.env"'
    )
    result = run("queue", "work", "jobs", "--url", store, "--max-messages", "2", "--", *sh(script))
    assert result.returncode == 0, result.stderr
    assert "2 acked, 0 failed" in result.stderr
    assert (tmp_path / f"{ids[0]}.in").read_bytes() == '{"order":42,"text":"é"}'.encode()
    assert (tmp_path / f"{ids[1]}.in").read_bytes() == b"\x00raw\xff"
    env0 = (tmp_path / f"{ids[0]}.env").read_text().splitlines()
    assert env0 == [
        "TURNSTILE_ATTEMPT=1",
        f"TURNSTILE_MESSAGE_ID={ids[0]}",
        "TURNSTILE_MESSAGE_KEY=order-42",
        "TURNSTILE_QUEUE=jobs",
    ]
    env1 = (tmp_path / f"{ids[1]}.env").read_text()
    assert "TURNSTILE_MESSAGE_KEY" not in env1  # no key: unset, not empty
    with queue(store) as q:
        stats = q.stats()
    assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)


def test_non_zero_exit_nacks_retries_then_dead_letters(store: str, tmp_path: Path) -> None:
    with queue(store) as q:
        doomed = q.put("doomed")
        flaky = q.put("flaky")
    # "doomed" always exits 3; "flaky" fails its first delivery only.
    script = (
        f'p=$(cat); echo "$TURNSTILE_MESSAGE_ID $TURNSTILE_ATTEMPT" >> "{tmp_path}/log"; '
        'if [ "$p" = \'"doomed"\' ]; then exit 3; fi; [ "$TURNSTILE_ATTEMPT" -ge 2 ]'
    )
    result = run(
        "queue", "work", "jobs", "--url", store, "--max-attempts", "3", "--backoff", "0.05",
        "--max-messages", "5", "--", *sh(script),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "1 acked, 4 failed" in result.stderr
    log = (tmp_path / "log").read_text().split()
    runs = list(zip(log[::2], log[1::2], strict=True))
    assert [a for i, a in runs if i == doomed] == ["1", "2", "3"]
    assert [a for i, a in runs if i == flaky] == ["1", "2"]
    with queue(store) as q:
        dead = q.dead_letters()
        stats = q.stats()
    assert [(d.id, d.attempts, d.payload) for d in dead] == [(doomed, 3, "doomed")]
    assert "command exited with 3" in (dead[0].error or "")
    assert (stats.ready, stats.delayed, stats.in_flight) == (0, 0, 0)


def test_per_key_order_with_concurrency_4(store: str, tmp_path: Path) -> None:
    keys = ["a", "b", "c"]
    per_key = 4
    with queue(store) as q:
        for seq in range(per_key):
            for key in keys:
                q.put(seq, key=key)
    # The first message of each key waits until every key's first message has started: it
    # finishes only if the worker runs the three keys at once (no timing luck involved).
    script = (
        f'd="{tmp_path}"; seq=$(cat); k=$TURNSTILE_MESSAGE_KEY; '
        'echo "start $k $seq" >> "$d/log"; '
        'if [ "$seq" = 0 ]; then touch "$d/first.$k"; i=0; '
        'while [ "$(ls "$d" | grep -c ^first)" -lt 3 ]; do '
        "i=$((i+1)); [ $i -gt 400 ] && exit 9; sleep 0.05; done; fi; "
        'sleep 0.05; echo "end $k $seq" >> "$d/log"'
    )
    result = run(
        "queue", "work", "jobs", "--url", store, "--concurrency", "4",
        "--max-messages", str(per_key * len(keys)), "--", *sh(script),
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"{per_key * len(keys)} acked, 0 failed" in result.stderr
    events = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    for key in keys:
        mine = [(what, int(seq)) for what, k, seq in events if k == key]
        # One at a time per key, in put order: start 0, end 0, start 1, end 1, …
        assert mine == [(w, s) for s in range(per_key) for w in ("start", "end")], mine


def test_prefetch_claims_a_batch_in_one_step(store: str, tmp_path: Path) -> None:
    """--prefetch 3: the worker's one slot claims the three messages (three keys) at once,
    so while the first command runs all three are in flight; each runs once, all are acked,
    and a fourth message of the first key runs after its predecessor's ack."""
    with queue(store) as q:
        ids = [q.put(i, key=f"k{i}") for i in range(3)]
        later = q.put(3, key="k0")
    stats = [sys.executable, "-m", "turnstile", "queue", "stats", "jobs", "--url", store, "--json"]
    script = (
        f'd="{tmp_path}"; cat > /dev/null; echo "$TURNSTILE_MESSAGE_ID" >> "$d/log"; '
        f'[ -e "$d/stats" ] || {shlex.join(stats)} > "$d/stats"'
    )
    result = run(
        "queue", "work", "jobs", "--url", store, "--prefetch", "3", "--max-messages", "4",
        "-v", "--", *sh(script), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "claiming up to 3 at once" in result.stderr
    assert "4 acked, 0 failed" in result.stderr
    seen = json.loads((tmp_path / "stats").read_text())
    assert (seen["in_flight"], seen["ready"]) == (3, 1)  # the batch claimed, k0's next waits
    log = (tmp_path / "log").read_text().split()
    assert sorted(log) == sorted([*ids, later]) and log[-1] == later
    with queue(store) as q:
        stats_after = q.stats()
    assert (stats_after.ready, stats_after.in_flight, stats_after.dead) == (0, 0, 0)


def test_worker_killed_9_message_redelivered_after_visibility_timeout(
    store: str, tmp_path: Path
) -> None:
    vt = 2.0
    with queue(store) as q:
        message_id = q.put("job")
    # First delivery: note the child's pid and hang; later deliveries succeed.
    script = (
        f'd="{tmp_path}"; echo "$TURNSTILE_ATTEMPT" >> "$d/attempts"; '
        'if [ "$TURNSTILE_ATTEMPT" = 1 ]; then echo $$ > "$d/pid"; exec sleep 120; fi'
    )
    args = ("queue", "work", "jobs", "--url", store, "--visibility-timeout", str(vt))
    first = spawn(*args, "--", *sh(script), stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: (tmp_path / "pid").exists(), 60, "the first delivery")
        # While CMD runs the worker extends the message: well past the visibility timeout,
        # nobody else can take it.
        with queue(store) as q:
            wait_until(lambda: q.stats().in_flight == 1, 10, "in flight")
            for _ in range(3):
                assert q.get(timeout=vt) is None
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)  # the orphaned CMD
    result = run(*args, "--max-messages", "1", "--", *sh(script))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "attempts").read_text().split() == ["1", "2"]
    with queue(store) as q:
        stats = q.stats()
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)
        assert q.get(timeout=0) is None
        assert q.dead_letters() == []
    assert message_id


# The trap is set before the command says it started: a test that sees it started may
# signal it at once (a busy machine can hold the shell between two of its lines for long).
WAIT_FOR_GO = (
    'd="{d}"; trap \'echo term >> "$d/termed"; exit 143\' TERM; '
    'touch "$d/started.$TURNSTILE_MESSAGE_ID"; i=0; while [ ! -e "$d/go" ]; do i=$((i+1)); '
    "[ $i -gt 1200 ] && exit 9; sleep 0.05; done"
)


def _started(tmp_path: Path) -> int:
    return len(list(tmp_path.glob("started.*")))


@contextlib.contextmanager
def _two_commands_running(
    store: str, tmp_path: Path, *options: str, new_session: bool = False
) -> Iterator[tuple[subprocess.Popen[str], set[str]]]:
    """Two messages put (keys k0 and k1), then ``turnstile queue work`` on them with
    ``--concurrency 2`` and ``options``, each command waiting for the file ``go`` in
    ``tmp_path``: the worker and the message ids once both commands run. A worker still
    running at the end is killed. The worker starts with the default action for the signals
    under test (``spawn``): a suite started in the background of a non-interactive shell, as
    CI may start it, inherits SIGINT ignored, and the worker rightly keeps an ignored signal
    ignored."""
    with queue(store) as q:
        ids = {q.put(n, key=f"k{n}") for n in range(2)}
    proc = spawn(
        "queue", "work", "jobs", "--url", store, "--concurrency", "2", *options,
        "--", *sh(WAIT_FOR_GO.format(d=tmp_path)),
        stdout=subprocess.DEVNULL,
        start_new_session=new_session,
    )  # fmt: skip
    try:
        wait_until(lambda: _started(tmp_path) == 2, 60, "both commands running")
        yield proc, ids
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_sigterm_drains_running_commands_and_takes_no_new_message(
    store: str, tmp_path: Path
) -> None:
    with _two_commands_running(store, tmp_path, "--grace", "120") as (proc, _):
        proc.send_signal(signal.SIGTERM)
        # The drain has begun once the worker says so (a busy machine can hold the signal's
        # handling back for long; letting the commands end before it would let the worker
        # take the late message as if no signal had come).
        first = _line_of(proc, 60)
        assert "SIGTERM: taking no new message" in first
        assert "for 2 running command(s)" in first
        with queue(store) as q:
            late = q.put("late")
        assert proc.poll() is None
        (tmp_path / "go").touch()
        code, err = finish(proc)
    assert code == 0, err
    assert "stopped (SIGTERM): 2 acked, 0 failed" in err
    assert not (tmp_path / "termed").exists()
    assert _started(tmp_path) == 2
    with queue(store) as q:
        stats = q.stats()
        assert (stats.ready, stats.in_flight) == (1, 0)
        message = q.get(timeout=0)
        assert message is not None and message.id == late


def test_sigterm_past_grace_terminates_and_nacks_for_redelivery(store: str, tmp_path: Path) -> None:
    with _two_commands_running(store, tmp_path, "--grace", "0.2") as (proc, ids):
        proc.send_signal(signal.SIGINT)
        code, err = finish(proc)
    assert code == 0, err
    assert "grace period over" in err
    assert "stopped (SIGINT): 0 acked, 2 failed" in err
    assert (tmp_path / "termed").read_text().split() == ["term", "term"]
    with queue(store) as q:
        stats = q.stats()
        assert (stats.ready, stats.in_flight, stats.dead) == (2, 0, 0)  # nacked, no backoff
        taken = [q.get(timeout=0) for _ in ids]
    assert {m.id for m in taken if m is not None} == ids
    assert {m.attempt for m in taken if m is not None} == {2}


def test_past_grace_the_unstarted_rest_of_a_prefetched_batch_is_not_run(
    store: str, tmp_path: Path
) -> None:
    """--prefetch 2 with one slot: both messages claimed in one step, the first command
    running. SIGTERM with a short grace period: the running command is terminated and its
    message nacked, and the second message, reached after the grace period ended, is nacked
    without its command ever starting; both can be delivered again at once."""
    with queue(store) as q:
        ids = {q.put(n, key=f"k{n}") for n in range(2)}
    proc = spawn(
        "queue", "work", "jobs", "--url", store, "--prefetch", "2", "--grace", "0.2",
        "--", *sh(WAIT_FOR_GO.format(d=tmp_path)),
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: _started(tmp_path) == 1, 60, "the first command running")
        with queue(store) as q:
            assert q.stats().in_flight == 2  # the batch: both claimed
        proc.send_signal(signal.SIGTERM)
        code, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert code == 0, err
    assert "stopped (SIGTERM): 0 acked, 2 failed" in err
    assert _started(tmp_path) == 1  # the second command never ran
    assert (tmp_path / "termed").read_text().split() == ["term"]
    with queue(store) as q:
        stats = q.stats()
        assert (stats.ready, stats.in_flight, stats.dead) == (2, 0, 0)
        taken = [q.get(timeout=0) for _ in ids]
    assert {m.id for m in taken if m is not None} == ids


def test_a_second_signal_ends_the_grace_period_at_once(store: str, tmp_path: Path) -> None:
    with _two_commands_running(store, tmp_path, "--grace", "600") as (proc, _):
        proc.send_signal(signal.SIGTERM)
        # Two signals of a kind that arrive before the first is handled are one (the kernel
        # and Python both merge them): the second is sent once the drain has begun.
        first = _line_of(proc, 60)
        assert "SIGTERM: taking no new message; waiting up to 600 seconds" in first
        proc.send_signal(signal.SIGTERM)
        code, err = finish(proc)
    assert code == 0, err
    assert "grace period over" in err
    assert "stopped (SIGTERM): 0 acked, 2 failed" in err
    assert (tmp_path / "termed").read_text().split() == ["term", "term"]


def test_usage_errors_name_the_flag(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/u.db"
    result = run("queue", "work", "jobs", "--url", url)
    assert result.returncode == 2 and "give the command to run after --" in result.stderr
    result = run("queue", "work", "jobs", "--url", url, "--concurrency", "0", "--", "true")
    assert result.returncode == 2 and "--concurrency" in result.stderr
    result = run("queue", "work", "jobs", "--url", url, "--prefetch", "1001", "--", "true")
    assert result.returncode == 2 and "--prefetch" in result.stderr and "1000" in result.stderr
    result = run("queue", "work", "jobs", "--url", url, "--", "no-such-command-xyz")
    assert result.returncode == 127 and "command not found" in result.stderr


def test_ctrl_c_to_the_process_group_nacks_without_backoff(store: str, tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the worker and its commands alike: the commands die of
    it, and their messages go back without the --backoff a failure would get."""
    options = ("--backoff", "600", "--max-backoff", "600")
    with _two_commands_running(store, tmp_path, *options, new_session=True) as (proc, ids):
        os.killpg(proc.pid, signal.SIGINT)
        code, err = finish(proc)
    assert code == 0, err
    assert "stopped (SIGINT): 0 acked, 2 failed" in err
    assert "stopped by the drain" in err
    with queue(store) as q:
        stats = q.stats()
        assert (stats.ready, stats.delayed, stats.in_flight) == (2, 0, 0)
        taken = [q.get(timeout=0) for _ in ids]
    assert {m.id for m in taken if m is not None} == ids
