"""`turnstile status`: holders and waiters in order, as a table and as JSON."""

from __future__ import annotations

import json
import signal
import subprocess
from functools import partial
from pathlib import Path

import pytest

from turnstile.stores.sqlite.lock_store import SCHEMA_VERSION

from ._invoke import py, run, spawn, wait_until, waiters

pytestmark = pytest.mark.timeout(120)


def _hold(url: str, name: str, holder: str) -> tuple[subprocess.Popen[str], int]:
    proc = spawn(
        "run",
        "--url",
        url,
        "--lock",
        name,
        "--holder",
        holder,
        "--",
        *py(
            "import os, time; print(os.environ['TURNSTILE_FENCING_TOKEN'], flush=True); "
            "time.sleep(60)"
        ),
    )
    assert proc.stdout is not None
    token = proc.stdout.readline().strip()
    assert token, proc.stderr.read() if proc.stderr else ""
    return proc, int(token)


def _in_line(url: str, name: str, holder: str) -> bool:
    return holder in waiters(url, name)


def test_status_shows_holders_and_waiters_in_order(url: str, tmp_path: Path) -> None:
    served = tmp_path / "served"
    holder, token = _hold(url, "order:42", "web-1")
    queued = []
    try:
        for name in ("web-2", "web-3"):  # join one after the other: that is their order
            queued.append(
                spawn(
                    "run",
                    "--url",
                    url,
                    "--lock",
                    "order:42",
                    "--holder",
                    name,
                    "--",
                    *py(
                        f"import os; open({str(served)!r}, 'a').write("
                        "os.environ['TURNSTILE_HOLDER'] + '\\n')"
                    ),
                )
            )
            wait_until(partial(_in_line, url, "order:42", name), what=f"{name} in line")

        text = run("status", "--url", url, "order:42")
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[0] == "order:42: 1/1 held, 2 waiting"
        assert lines[1].split() == ["HOLDER", "TOKEN", "AGE", "EXPIRES", "IN"]
        assert lines[2].split()[:2] == ["web-1", str(token)]
        assert lines[3].split() == ["POSITION", "WAITER", "WAITING"]
        assert lines[4].split()[:2] == ["0", "web-2"]
        assert lines[5].split()[:2] == ["1", "web-3"]

        data = json.loads(run("status", "--url", url, "order:42", "--json").stdout)
        assert data["name"] == "order:42" and data["limit"] == 1
        [held] = data["holders"]
        assert held["holder"] == "web-1" and held["token"] == token
        assert 0 <= held["age"] < 60 and 0 < held["expires_in"] <= 30
        assert [(w["holder"], w["position"]) for w in data["waiters"]] == [
            ("web-2", 0),
            ("web-3", 1),
        ]

        everything = run("status", "--url", url)
        assert everything.stdout.splitlines()[0] == "order:42: 1/1 held, 2 waiting"
        listed = json.loads(run("status", "--url", url, "--json").stdout)
        assert [n["name"] for n in listed["names"]] == ["order:42"]
        assert listed["truncated"] is False and listed["url"] == url
        assert (
            json.loads(run("status", "--url", url, "--json", "--prefix", "order:").stdout)["names"][
                0
            ]["holders"][0]["token"]
            == token
        )
        assert (
            json.loads(run("status", "--url", url, "--json", "--prefix", "user:").stdout)["names"]
            == []
        )
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=10)
        for proc in queued:
            assert proc.wait(timeout=10) == 0
    assert served.read_text().split() == ["web-2", "web-3"]  # served in the order shown


def test_status_of_nothing(url: str) -> None:
    empty = run("status", "--url", url)
    assert empty.returncode == 0
    assert empty.stdout.strip() == (
        f"no names have holders or waiters (store: {url})\nstore: schema version "
        f"{SCHEMA_VERSION}, up to date"
    )
    data = json.loads(run("status", "--url", url, "--json").stdout)
    assert data["names"] == []
    assert data["schema"]["store"] == "sqlite" and data["schema"]["up_to_date"] is True
    assert data["schema"]["applied"] == data["schema"]["latest"] == SCHEMA_VERSION
    free = run("status", "--url", url, "some name")
    assert free.stdout.strip() == "some name: free (no holders, no waiters)"
    data = json.loads(run("status", "--url", url, "some name", "--json").stdout)
    assert data["holders"] == [] and data["waiters"] == []


def test_status_escapes_control_characters(url: str) -> None:
    holder, _ = _hold(url, "evil\x1b[2Jname", "h\x1b[31mred")
    try:
        text = run("status", "--url", url).stdout
        assert "\x1b" not in text
        assert "evil\\x1b[2Jname" in text and "h\\x1b[31mred" in text
        data = json.loads(run("status", "--url", url, "--json").stdout)
        assert data["names"][0]["name"] == "evil\x1b[2Jname"  # JSON keeps the exact name
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=10)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["x", "--prefix", "y"], "--prefix applies only without NAME"),
        ([""], "NAME: must not be empty"),
    ],
)
def test_status_bad_arguments(url: str, args: list[str], expected: str) -> None:
    result = run("status", "--url", url, *args)
    assert result.returncode == 2
    assert expected in result.stderr
    assert result.stderr.count("\n") == 1
