from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.backends import BACKENDS, BackendRow, delete_redis_library, redis_library_servers


@dataclass(frozen=True)
class BackendUnderTest:
    """One backend, with a URL whose data belongs to this test alone."""

    name: str
    url: str
    cross_process: bool
    row: BackendRow


_STATE_HOME: tuple[str | None, str] | None = None
# The Turnstile function libraries this session loads on the given Redis servers, and so
# deletes at its end: (server URL, library name).
_REDIS_LIBRARIES: list[tuple[str, str]] = []


def pytest_configure(config: pytest.Config) -> None:
    """The default store lives in $XDG_STATE_HOME: no test (nor a command it starts) may
    touch the user's real one. (A hook, not an autouse session fixture: such a fixture would
    put every test in one pytest-xdist group below.)"""
    global _STATE_HOME, _REDIS_LIBRARIES
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        _REDIS_LIBRARIES = redis_library_servers()
    private = tempfile.mkdtemp(prefix="turnstile-xdg-state-")
    _STATE_HOME = (os.environ.get("XDG_STATE_HOME"), private)
    os.environ["XDG_STATE_HOME"] = private


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        delete_redis_library(_REDIS_LIBRARIES)
    if _STATE_HOME is None:
        return
    previous, private = _STATE_HOME
    if previous is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = previous
    shutil.rmtree(private, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep together, on one pytest-xdist worker (``--dist loadgroup``, as ``scripts/dev.py
    test`` runs the suite), the tests that share a fixture wider than one test: a session
    fixture of ours (e.g. ``pg_cluster``, a PostgreSQL server that its tests restart) is then
    set up once, and a module's shared server once per module. Every other test owns its data
    (tests/backends.py) and runs on whichever worker is free."""
    for item in items:
        group = _shared_fixture_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _shared_fixture_group(item: pytest.Item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module_group = None
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if not getattr(fixturedef.func, "__module__", "").startswith("tests."):
                continue  # a plugin's (e.g. pytest-asyncio's session event loop policy)
            if fixturedef.scope == "session":
                return name
            if fixturedef.scope in ("package", "module", "class"):
                module_group = item.nodeid.split("::", 1)[0]
    return module_group


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
