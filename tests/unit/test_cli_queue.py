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
    got = tq(tmp_path, "get", "jobs", "--visibility-timeout", "1.5", "--max-attempts", "1")
    m = json.loads(got.stdout)
    assert (m["id"], m["payload"], m["attempt"]) == (first.stdout.strip(), {"order": 42}, 1)
    assert tq(tmp_path, "get", "jobs").returncode == 75  # o42 is in flight
    import time

    time.sleep(1.6)  # its visibility timeout passes; max_attempts=1: dead
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
