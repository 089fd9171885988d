"""The default store, empty URLs and configuration errors (exit 78, ConfigurationError):
one SQLite file per user and host in the XDG state directory, whatever the working
directory; explicit relative paths as given; a file that is not a database, a folder that
does not exist and a Redis database index out of range are configuration, not an
unavailable store (69, which a retry loop would retry forever)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import turnstile
from turnstile.errors import BackendUnavailable, ConfigurationError

from ._invoke import py, run

pytestmark = pytest.mark.timeout(120)

HOLD = "import sys, time; print('holding', flush=True); sys.stdin.read()"


def _state_env(state: Path) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(state)}


def test_two_runs_from_two_directories_exclude_each_other(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first_dir.mkdir()
    second_dir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-m", "turnstile", "run", "--lock", "nightly", "--", *py(HOLD)],
        cwd=first_dir,
        env={**_environment(), **_state_env(state)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding", holder.stderr
        other = run(
            "run", "--lock", "nightly", "--timeout", "0", "--", "true",
            cwd=second_dir, env=_state_env(state),
        )  # fmt: skip
        assert other.returncode == 75, other.stderr  # excluded: the same lock
        assert "timed out" in other.stderr
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the held command ends
        assert holder.wait(timeout=30) == 0
    again = run(
        "run", "--lock", "nightly", "--timeout", "0", "--", "true",
        cwd=second_dir, env=_state_env(state),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr  # released: free for the next one
    assert not (first_dir / "turnstile.db").exists() and not (second_dir / "turnstile.db").exists()


def test_the_default_file_is_private_to_its_user(tmp_path: Path) -> None:
    state = tmp_path / "fresh" / "state"  # missing folders of the default are created
    result = run("run", "--lock", "x", "--", "true", env=_state_env(state))
    assert result.returncode == 0, result.stderr
    folder = state / "turnstile"
    db = folder / "turnstile.db"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_help_and_status_say_where_the_default_store_is(tmp_path: Path) -> None:
    state = tmp_path / "state"
    where = f"sqlite:///{state}/turnstile/turnstile.db"
    for args in (("--help",), ("run", "--help"), ("status", "--help")):
        shown = run(*args, env=_state_env(state))
        assert shown.returncode == 0
        assert where in "".join(shown.stdout.split()), (args, shown.stdout)  # however wrapped
    listing = run("status", env=_state_env(state))
    assert listing.returncode == 0, listing.stderr
    first, *rest = listing.stdout.strip().splitlines()
    assert first == f"no names have holders or waiters (store: {where})"
    assert len(rest) == 1 and rest[0].startswith("store: schema version"), listing.stdout
    assert rest[0].endswith(", up to date"), listing.stdout


def test_an_explicit_relative_path_is_relative_to_the_working_directory(tmp_path: Path) -> None:
    for url in ("sqlite:///./here.db", "sqlite:///here2.db"):
        result = run("run", "--url", url, "--lock", "x", "--", "true", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "here.db").exists() and (tmp_path / "here2.db").exists()


@pytest.mark.parametrize("command", [("status",), ("run", "--lock", "x", "--", "true")])
def test_an_empty_url_is_refused(command: tuple[str, ...], tmp_path: Path) -> None:
    given = run(*command[:1], "--url", "", *command[1:], env=_state_env(tmp_path))
    assert given.returncode == 78, given.stderr
    assert given.stderr.startswith("turnstile: error: the store URL is empty")
    from_env = run(*command, env={"TURNSTILE_URL": "", **_state_env(tmp_path)})
    assert from_env.returncode == 78, from_env.stderr
    assert "$TURNSTILE_URL is set but empty" in from_env.stderr
    assert not (tmp_path / "turnstile").exists()  # the default was not used instead


def test_serve_refuses_an_empty_url(tmp_path: Path) -> None:
    result = run("serve", "--url", "", "--port", "0", env=_state_env(tmp_path))
    assert result.returncode == 78, result.stderr
    assert "the store URL is empty" in result.stderr


# -- configuration errors -----------------------------------------------------------------


def _cli_and_api(url: str, expect: str) -> None:
    result = run("status", "--url", url)
    assert result.returncode == 78, result.stderr
    assert expect in result.stderr, result.stderr
    with pytest.raises(ConfigurationError, match=expect):
        turnstile.connect(url).close()


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("these are not the pages you are looking for\n" * 100)
    _cli_and_api(f"sqlite:///{path}", "is not a SQLite database")
    assert path.read_text().startswith("these are not")  # left alone


def test_an_explicit_path_in_a_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "folder"
    _cli_and_api(f"sqlite:///{missing}/x.db", f"the folder of the SQLite file '{missing}/x.db'")
    assert not (tmp_path / "no").exists()  # not created: only the default's folder is


def test_a_folder_instead_of_a_file(tmp_path: Path) -> None:
    _cli_and_api(f"sqlite:///{tmp_path}", "is a folder, not a SQLite file")


def test_sqlite_store_errors_after_opening_stay_unavailable(tmp_path: Path) -> None:
    """Only configuration is configuration: a closed client is still 'unavailable'."""
    client = turnstile.connect(f"sqlite:///{tmp_path}/ok.db")
    client.close()
    with pytest.raises(BackendUnavailable):
        client.status("x")


def _redis_server() -> str:
    server = os.environ.get("TURNSTILE_TEST_REDIS_URL")
    if not server:
        pytest.skip("TURNSTILE_TEST_REDIS_URL is not set")
    pytest.importorskip("redis")
    return server.rsplit("/", 1)[0]


@pytest.mark.parametrize(
    ("db", "expect"),
    [
        ("99999", "has no such database"),  # the server's answer (16 databases by default)
        ("4294967296", "database index 4294967296"),  # above any server's: not even tried
    ],
)
def test_redis_database_index_out_of_range(db: str, expect: str) -> None:
    _cli_and_api(f"{_redis_server()}/{db}", expect)


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}


