"""``turnstile queue …`` end to end on a private SQLite file, in real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def tq(tmp: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TURNSTILE_URL": f"sqlite:///{tmp}/cli.db"}
    return subprocess.run(
        [sys.executable, "-m", "turnstile", "queue", *args],
        input=stdin, capture_output=True, text=True, env=env, timeout=60,
    )


def test_cli_queue_round_trip(tmp_path: Path) -> None:
    first = tq(tmp_path, "put", "jobs", '{"order": 42}', "--key", "o42")
    assert first.returncode == 0, first.stderr
    assert tq(tmp_path, "put", "jobs", "-", "--key", "o42", stdin='"second"').returncode == 0
    stats = json.loads(tq(tmp_path, "stats", "jobs", "--json").stdout)
    assert (stats["ready"], stats["deepest_keys"]) == (2, [{"key": "o42", "pending": 2}])
    import time

    vt = 8.0  # the next command (a fresh process, slow to start on a loaded machine) runs within
    got = tq(tmp_path, "get", "jobs", "--visibility-timeout", str(vt), "--max-attempts", "1")
    # The store started the visibility timeout before `get` returned: it has surely passed
    # vt after this point (measured before the command, it may not have, on a slow start).
    taken = time.monotonic()
    m = json.loads(got.stdout)
    assert (m["id"], m["payload"], m["attempt"]) == (first.stdout.strip(), {"order": 42}, 1)
    assert tq(tmp_path, "get", "jobs").returncode == 75  # o42 is in flight
    # its visibility timeout passes; max_attempts=1: dead
    time.sleep(max(0.0, taken + vt + 0.2 - time.monotonic()))
    assert tq(tmp_path, "ack", "jobs", m["id"], m["receipt"]).returncode == 1  # stale
    dead = json.loads(tq(tmp_path, "dead", "jobs", "--json").stdout)
    assert [d["id"] for d in dead] == [m["id"]]
    second = json.loads(tq(tmp_path, "get", "jobs", "--ack").stdout)
    assert (second["payload"], second["acked"]) == ("second", True)
    assert "requeued 1" in tq(tmp_path, "requeue", "jobs", "--all").stdout
    assert "purged 0" in tq(tmp_path, "purge", "jobs", "--all").stdout


def test_cli_queue_bad_input(tmp_path: Path) -> None:
    bad = tq(tmp_path, "put", "jobs", "not json")
    assert bad.returncode == 2 and "PAYLOAD must be JSON" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = tq(tmp_path, "put", "jobs", "1", "--delay", "-1")
    assert bad.returncode == 2 and "delay" in bad.stderr
    big = tq(tmp_path, "put", "jobs", "-", stdin=json.dumps("x" * 300_000))
    assert big.returncode == 2 and "256 KiB" in big.stderr
    assert tq(tmp_path, "requeue", "jobs").returncode == 2  # neither IDs nor --all


def test_cli_queue_list(tmp_path: Path) -> None:
    empty = tq(tmp_path, "list")
    assert (empty.returncode, empty.stdout) == (0, "no queue holds messages\n")
    for queue in ("jobs", "jobs:eu", "mail"):
        assert tq(tmp_path, "put", queue, "1").returncode == 0
    assert tq(tmp_path, "list").stdout.splitlines() == ["jobs", "jobs:eu", "mail"]
    assert tq(tmp_path, "list", "jobs:").stdout.splitlines() == ["jobs:eu"]
    assert tq(tmp_path, "list", "--max", "1").stdout.splitlines() == ["jobs"]
    assert json.loads(tq(tmp_path, "list", "--json").stdout) == ["jobs", "jobs:eu", "mail"]
    with_stats = tq(tmp_path, "list", "ma", "--stats").stdout.splitlines()
    assert with_stats[0].split() == ["QUEUE", "READY", "DELAYED", "IN", "FLIGHT", "DEAD", "OLDEST"]
    assert with_stats[1].split()[:5] == ["mail", "1", "0", "0", "0"]
    rows = json.loads(tq(tmp_path, "list", "--stats", "--json").stdout)
    assert [(r["name"], r["ready"]) for r in rows] == [("jobs", 1), ("jobs:eu", 1), ("mail", 1)]
    none = tq(tmp_path, "list", "x")
    assert none.stdout == "no queue holds messages starting with 'x'\n"
    bad = tq(tmp_path, "list", "--max", "0")
    assert bad.returncode == 2 and "--max" in bad.stderr and "Traceback" not in bad.stderr
