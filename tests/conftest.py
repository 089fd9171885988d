from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.backends import BACKENDS, BackendRow


@dataclass(frozen=True)
class BackendUnderTest:
    """One backend, with a URL whose data belongs to this test alone."""

    name: str
    url: str
    cross_process: bool
    row: BackendRow


@pytest.fixture(autouse=True, scope="session")
def _private_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The default store lives in $XDG_STATE_HOME: no test (nor a command it starts) may
    touch the user's real one."""
    previous = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = previous


def _params() -> list[object]:
    return [
        pytest.param(row, id=row.name, marks=getattr(pytest.mark, row.name)) for row in BACKENDS
    ]


@pytest.fixture(params=_params())
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendUnderTest]:
    row: BackendRow = request.param
    server = row.server_url()
    if server is None:
        message = f"{row.env} is not set (scripts/dev.py test starts a server and sets it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    uid = secrets.token_hex(5)
    url = row.make_url(server, uid, tmp_path)
    try:
        yield BackendUnderTest(row.name, url, row.cross_process, row)
    finally:
        row.cleanup(server, uid)


@pytest.fixture
def url(backend: BackendUnderTest) -> str:
    return backend.url
