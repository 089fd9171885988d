"""What `turnstile run` gives its command (issue 17, point 5): the fencing token as
TURNSTILE_FENCING_TOKEN, and the caller's TURNSTILE_TOKEN (the HTTP service's bearer token)
untouched, so a `turnstile` command inside `turnstile run` against an http:// store keeps
its credentials."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.http_server import start_server

from ._invoke import py, run

pytestmark = [pytest.mark.timeout(120), pytest.mark.http]

CHILD = """
import json, os, subprocess, sys
status = subprocess.run(
    [sys.executable, "-m", "turnstile", "status", "nightly", "--json"],
    capture_output=True, text=True,
)
print(json.dumps({
    "code": status.returncode, "out": status.stdout, "err": status.stderr,
    "fencing": os.environ.get("TURNSTILE_FENCING_TOKEN"),
    "bearer": os.environ.get("TURNSTILE_TOKEN"),
}))
"""


def test_a_turnstile_command_inside_run_keeps_the_bearer_token(tmp_path: Path) -> None:
    server = start_server(
        f"sqlite:///{tmp_path}/service.db", tmp_path,
        tokens=[{"name": "all", "prefixes": [""]}],
    )  # fmt: skip
    try:
        bearer = server.tokens["all"]
        env = {"TURNSTILE_URL": server.base, "TURNSTILE_TOKEN": bearer}
        result = run("run", "--lock", "nightly", "--holder", "me", "--", *py(CHILD), env=env)
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout)
        assert seen["code"] == 0, seen["err"]  # the child reached the service: not 78
        assert seen["bearer"] == bearer  # the caller's bearer token, passed on as it was
        status = json.loads(seen["out"])
        assert [h["holder"] for h in status["holders"]] == ["me"]
        assert int(seen["fencing"]) == status["holders"][0]["token"] > 0
    finally:
        server.stop()
