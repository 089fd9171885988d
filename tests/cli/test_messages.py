"""What a new user reads: `turnstile --help`, `--json` output, error messages (CLI flags, not
Python parameters; `error:`; human durations; one hint; no ".;"), raw payloads, names with
control characters."""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import subprocess
import sys

import pytest

from turnstile._core import urls, validate
from turnstile.cli import build_parser

from ._invoke import environment, run


def _queue_actions() -> list[str]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    queue = commands.choices["queue"]
    actions = next(a for a in queue._actions if isinstance(a, argparse._SubParsersAction))
    return list(actions.choices)


def test_help_lists_every_command_and_queue_action() -> None:
    out = run("--help")
    assert out.returncode == 0
    actions = _queue_actions()
    assert {"list", "put", "get", "ack", "nack", "stats", "dead", "requeue", "purge"} <= set(
        actions
    )
    assert "turnstile queue " + "|".join(actions) + " …" in out.stdout
    for command in ("run", "status", "ask", "release", "deliver", "demo", "queue", "serve"):
        assert f"turnstile {command}" in out.stdout
    for command in ("dispatch sfn", "bridge sqs", "migrate"):
        assert f"turnstile {command}" in out.stdout
    bare = run("queue", "--url", "memory://")
    assert bare.returncode == 2
    assert f"choose an action: {', '.join(actions)} " in bare.stderr


def _stderr_of(*args: str) -> str:
    out = run(*args)
    assert out.returncode == 2, (args, out.stdout, out.stderr)
    return out.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["queue", "get", "q", "--visibility-timeout", "0"],
            "argument --visibility-timeout: must be between 0.05 and 43200 seconds (12 hours)",
        ),
        (
            ["queue", "put", "q", "{}", "--delay", "1e9"],
            "argument --delay: must be between 0 and 2592000 seconds (30 days)",
        ),
        (
            ["queue", "put", "q", "{}", "--dedup-window", "1e12"],
            "argument --dedup-window: must be between 1 and 604800 seconds (7 days)",
        ),
        (["queue", "put", "q", "{}", "--key", ""], "argument --key: must be 1 to 1024 bytes"),
        (["queue", "put", "q", "{}", "--dedup-id", ""], "argument --dedup-id: must be 1 to"),
        (["queue", "ack", "q", "", "r"], "argument ID: must be 1 to 256 bytes"),
        (["queue", "nack", "q", "id", ""], "argument RECEIPT: must be 1 to 256 bytes"),
        (["queue", "requeue", "q", ""], "argument ID: must be 1 to 256 bytes"),
        (
            ["queue", "work", "q", "--backoff", "2e6", "--max-backoff", "1e6", "--", "true"],
            "--backoff (2000000 seconds) must not be more than --max-backoff (1000000 seconds)",
        ),
        (
            ["run", "--lock", "x", "--kill-after", "-1", "--", "true"],
            "argument --kill-after: must be between 0 and 2592000 seconds (30 days), got -1.0 ",
        ),
    ],
)
def test_errors_name_cli_arguments_and_read_well(
    args: list[str], expected: str, tmp_path: object
) -> None:
    err = _stderr_of(*args, "--url", "memory://")
    assert expected in err
    assert err.count("\n") == 1 and ": error: " in err
    assert not re.search(r"\b[a-z]+_[a-z_]+ must\b", err), err  # no Python parameter names
    assert not re.search(r"\d(\.\d+)?e[+-]?\d", err), err  # no 2.592e+06
    assert ".;" not in err and err.count("(see:") == 1
    assert "without a time limit" not in err  # --kill-after has a default, not "no limit"


def test_kill_after_help_says_when_it_applies() -> None:
    text = " ".join(run("run", "--help").stdout.split())
    assert "--kill-after S after a lost lease with --on-lost terminate" in text
    assert "never escalated" in text


def test_seconds_text() -> None:
    assert validate.seconds_text(2592000.0) == "2592000 seconds (30 days)"
    assert validate.seconds_text(43200.0) == "43200 seconds (12 hours)"
    assert validate.seconds_text(90.0) == "90 seconds"
    assert validate.seconds_text(0.05) == "0.05 seconds"
    assert validate.seconds_text(3600.0) == "3600 seconds (1 hour)"


def test_store_errors_have_one_hint_and_no_doubled_stop() -> None:
    pytest.importorskip("psycopg")
    pytest.importorskip("redis")
    for url in ("postgresql://someone@127.0.0.1:1/db", "redis://127.0.0.1:1/0"):
        out = run("status", "--url", url)
        assert out.returncode == 69, out.stderr
        assert out.stderr.startswith("turnstile: error: ")
        assert ".;" not in out.stderr and ". ;" not in out.stderr
        assert out.stderr.lower().count("server running") + out.stderr.count(
            "check the host"
        ) == 1, out.stderr


def test_backend_descriptions_read_as_nouns() -> None:
    for scheme, entry in urls.SCHEMES.items():
        message = str(urls.missing_driver(entry, ImportError("x", name="driver")))
        assert not re.search(r"\bthe (a|an|one|embedded default)\b", message), (scheme, message)
        assert message.startswith(f"the {entry.description} backend needs")


def test_json_is_one_line_in_a_pipe_and_indented_on_a_terminal(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/json.db"
    assert run("queue", "put", "jobs", '{"n": 1}', "--url", url).returncode == 0
    for args in (
        ["status", "--json"],
        ["queue", "list", "--json"],
        ["queue", "stats", "jobs", "--json"],
        ["queue", "dead", "jobs", "--json"],
        ["migrate", "--json"],
        ["limit", "jobs-limit", "2", "--json"],
    ):
        out = run(*args, "--url", url)
        assert out.stdout.count("\n") == 1 and out.stdout.endswith("\n"), (args, out.stdout)
        json.loads(out.stdout)
    # On a terminal: indented for people.
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "turnstile", "queue", "stats", "jobs", "--json", "--url", url],
            stdout=follower,
            stderr=subprocess.PIPE,
            env=environment(),
            timeout=60,
        )
        assert proc.returncode == 0
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        text = b"".join(chunks).decode().replace("\r\n", "\n")
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    assert text.startswith("{\n  ")
    assert json.loads(text)["ready"] == 1


def test_raw_payloads_print_unambiguously(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/raw.db"
    # A JSON payload that looks like the old bytes encoding, and real bytes.
    assert run("queue", "put", "q", '{"bytes": "616263"}', "--url", url).returncode == 0
    assert run("queue", "put", "q", "abc", "--raw", "--url", url).returncode == 0
    first = json.loads(run("queue", "get", "q", "--ack", "--url", url).stdout)
    second = json.loads(run("queue", "get", "q", "--url", url).stdout)
    assert (first["payload"], first["payload_base64"]) == ({"bytes": "616263"}, None)
    assert (second["payload"], second["payload_base64"]) == (None, "YWJj")  # base64 of abc
    # Used up as a dead letter: the same two fields.
    nack = run(
        "queue", "nack", "q", second["id"], second["receipt"], "--error", "x", "--url", url
    )
    assert nack.returncode == 0, nack.stderr
    for _ in range(4):  # max attempts 5 by default
        again = json.loads(run("queue", "get", "q", "--url", url).stdout)
        run("queue", "nack", "q", again["id"], again["receipt"], "--url", url)
    dead = json.loads(run("queue", "dead", "q", "--json", "--url", url).stdout)
    assert [(d["payload"], d["payload_base64"]) for d in dead] == [(None, "YWJj")]
    assert "payload_base64=YWJj" in run("queue", "dead", "q", "--url", url).stdout


def test_control_characters_are_escaped_once(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/ctl.db"
    name = "a\x01b"
    got = run("queue", "get", name, "--url", url)
    assert got.returncode == 75
    assert got.stderr.startswith("turnstile: error: timed out: no message in"), got.stderr
    assert "'a\\x01b'" in got.stderr and "\\\\x01" not in got.stderr
    listed = run("status", "--prefix", name, "--url", url)
    assert "'a\\x01b'" in listed.stdout and "\\\\x01" not in listed.stdout
    assert "\x01" not in listed.stdout + got.stderr
    # queue work names the queue and each message's key the same way.
    assert run("queue", "put", name, "{}", "--key", "k\x01y", "--url", url).returncode == 0
    worked = run(
        "queue", "work", name, "--max-messages", "1", "-v", "--url", url, "--", "true"
    )
    assert worked.returncode == 0, worked.stderr
    assert "'a\\x01b'" in worked.stderr and "'k\\x01y'" in worked.stderr, worked.stderr
    assert "\\\\x01" not in worked.stderr and "\x01" not in worked.stderr
    assert "stopped (--max-messages)" in worked.stderr


def test_demo_live_board_draws_its_last_frame_once() -> None:
    import io

    from turnstile.demo.arrivals import Update, Webhook
    from turnstile.demo.render import LiveBoard

    hooks = [Webhook("RA1", "A", 1, 0.0, 0.1), Webhook("RA2", "A", 2, 0.01, 0.1)]
    out = io.StringIO()
    board = LiveBoard(out, hooks)
    for kind, hook, at in [
        ("arrived", hooks[0], 0.0),
        ("started", hooks[0], 0.001),
        ("arrived", hooks[1], 0.01),
        ("ended", hooks[0], 0.1),
        ("started", hooks[1], 0.101),
        ("ended", hooks[1], 0.2),
    ]:
        board.update(Update(kind, hook, at))
    board.finish()
    assert out.getvalue().count("2/2 done") == 1
    assert out.getvalue().count("order A   RA1 done     RA2 done") == 1


def test_serve_errors_start_with_error(tmp_path: object) -> None:
    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    out = run("serve", "--url", f"sqlite:///{tmp_path}/s.db", "--host", "0.0.0.0")
    assert out.returncode == 78
    assert out.stderr.startswith("turnstile serve: error: refusing to listen")
