"""No secret is ever printed (issue 17, point 4).

For every scheme, a URL carries a secret in each position a user may put one (the
userinfo's password, a token written as the user, ``?password=``, ``?token=``, a
percent-encoded password in either place, a parameter in another case, a repeated
parameter). Every output path is walked with it: the Python API (the client's, the lock's,
the semaphore's, the queue's and the backend's ``repr``/``str``, a connection failure's
message, ``args`` and whole traceback with its causes, the library's log records), the
command line (``status`` as text and JSON, ``run -v``, ``--help`` with the URL in
``$TURNSTILE_URL``, every error line), the demo's "store:" line and ``serve``'s startup
warning, logs and errors. The secret's unique core must never appear in any of them.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import turnstile
from tests.http_server import ServerProcess, start_server
from turnstile.errors import TurnstileError

from ._invoke import environment, py, run

pytestmark = pytest.mark.timeout(600)

REDIS = os.environ.get("TURNSTILE_TEST_REDIS_URL")
POSTGRES = os.environ.get("TURNSTILE_TEST_POSTGRES_URL")


@dataclass(frozen=True)
class Position:
    """Where the secret goes: ``userinfo`` replaces the URL's userinfo (``None``: keep the
    scheme's own), ``query`` is added to its query string. ``{s}`` is the secret as written
    in the URL; ``{core}`` its unique part."""

    name: str
    userinfo: str | None = None
    query: str = ""


POSITIONS = [
    Position("userinfo-password", userinfo="{user}:{s}"),
    Position("userinfo-token", userinfo="{s}"),  # a token written as the user
    Position("userinfo-percent-encoded", userinfo="{user}:p%40ss%2F{core}%2B"),
    Position("query-password", query="password={s}"),
    Position("query-token", query="token={s}"),
    Position("query-other-case-percent-encoded", query="PassWord=p%40ss%2F{core}%2B"),
    Position("query-repeated", query="password=first{core}&password={s}"),
    Position("query-sslpassword-and-api-key", query="sslpassword={s}&api_key=k{core}"),
]


@dataclass
class Scheme:
    name: str
    # (position, secret, core, uid, tmp) -> URL; uid names the test's own data
    make: Callable[[Position, str, str, str, Path], str]
    cleanup: Callable[[str], None] = lambda uid: None


def _compose(
    scheme: str, default_userinfo: str, user: str, hostpath: str, query: str, pos: Position,
    secret: str, core: str,
) -> str:  # fmt: skip
    userinfo = default_userinfo
    if pos.userinfo is not None:
        userinfo = pos.userinfo.format(user=user, s=secret, core=core)
    netloc = f"{userinfo}@" if userinfo else ""
    extra = pos.query.format(s=secret, core=core)
    params = "&".join(p for p in (query, extra) if p)
    return f"{scheme}://{netloc}{hostpath}" + (f"?{params}" if params else "")


def _sqlite(pos: Position, secret: str, core: str, uid: str, tmp: Path) -> str:
    return _compose("sqlite", "", "u", f"/{tmp}/secret-walk.db", "", pos, secret, core)


def _memory(pos: Position, secret: str, core: str, uid: str, tmp: Path) -> str:
    return _compose("memory", "", "u", "local", "", pos, secret, core)


def _redis(pos: Position, secret: str, core: str, uid: str, tmp: Path) -> str:
    assert REDIS is not None
    hostpath = REDIS.split("://", 1)[1].rsplit("@", 1)[-1]
    return _compose(
        "redis", "", "default", hostpath, f"prefix=tt-secret-{uid}:", pos, secret, core
    )


def _redis_cleanup(uid: str) -> None:
    import redis

    assert REDIS is not None
    client = redis.Redis.from_url(REDIS)
    try:
        keys = list(client.scan_iter(match=f"tt-secret-{uid}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _postgres(pos: Position, secret: str, core: str, uid: str, tmp: Path) -> str:
    assert POSTGRES is not None
    rest = POSTGRES.split("://", 1)[1]
    userinfo, _, hostpath = rest.rpartition("@")
    user = userinfo.partition(":")[0] or "postgres"
    hostpath = hostpath.partition("?")[0]
    return _compose(
        "postgresql", userinfo, user, hostpath, f"schema=tt_secret_{uid}", pos, secret, core
    )


def _postgres_cleanup(uid: str) -> None:
    import psycopg

    assert POSTGRES is not None
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "tt_secret_{uid}" CASCADE')


SCHEMES = {
    "memory": Scheme("memory", _memory),
    "sqlite": Scheme("sqlite", _sqlite),
    "redis": Scheme("redis", _redis, _redis_cleanup),
    "postgresql": Scheme("postgresql", _postgres, _postgres_cleanup),
    "http": Scheme("http", lambda *a: ""),  # made by the fixture (_http_url)
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A service whose one token is a secret of this module; its URL is made per test."""
    tmp = tmp_path_factory.mktemp("secret-service")
    server = start_server(
        f"sqlite:///{tmp}/service.db", tmp,
        tokens=[{"name": "all", "prefixes": [""], "secret": f"tok{secrets.token_hex(12)}"}],
    )  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def _http_url(server: ServerProcess, pos: Position) -> tuple[str, str]:
    secret = server.tokens["all"]
    core = secret[3:]
    hostport = server.base.split("://", 1)[1]
    return _compose("http", "", "u", hostport, "", pos, secret, core), core


# -- the walk -------------------------------------------------------------------------------


def _attributes(obj: object, depth: int = 3) -> list[str]:
    """``repr`` of an object and of what it holds, a few levels down (connections, configs,
    pools): what a ``print(backend)`` or a debugger's variable view shows. Objects that
    write their own ``repr`` (a config dataclass) are judged by it."""
    shown = [repr(obj), str(obj)]
    plain = type(obj).__repr__ is object.__repr__
    if depth and plain and hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            if not isinstance(value, str | bytes):  # an attribute is not an output
                shown += _attributes(value, depth - 1)
    return shown


def _api(url: str) -> tuple[list[str], bool]:
    """What the Python API shows; and whether the URL opened a store."""
    out: list[str] = []
    try:
        client = turnstile.connect(url)
    except TurnstileError as exc:
        out += [str(exc), repr(exc), repr(exc.args), "".join(traceback.format_exception(exc))]
        return out, False
    with client:
        out += [repr(client), str(client), client.url, *_attributes(client.backend)]
        lock = client.lock("secret-walk", 10)
        sem = client.semaphore("secret-walk-sem", 2, 10)
        out += [repr(lock), str(lock), repr(sem)]
        with lock.acquire(timeout=30) as lease:
            out += [repr(lease), repr(client.status("secret-walk"))]
        if client.characteristics.queues:
            queue = client.queue("secret-walk-q")
            out += [repr(queue)]
            queue.put({"n": 1}, key="k")
            message = queue.get(timeout=5)
            assert message is not None
            out += [repr(message)]
            message.ack()
    return out, True


# The command line's main(), run for several argument lists in one fresh process (one
# interpreter start instead of seven), each with its own environment and captured output.
BATCH = """
import contextlib, io, json, os, sys
from turnstile.cli import main
results = []
base = dict(os.environ)
for argv, env in json.loads(sys.argv[1]):
    os.environ.clear()
    os.environ.update(base, **env)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def _cli(url: str) -> list[str]:
    in_env = {"TURNSTILE_URL": url}
    commands = [
        (["status", "--json", "--url", url], {}),
        (["status"], in_env),
        (["status", "secret-walk", "--url", url], {}),
        (["run", "-v", "--url", url, "--lock", "secret-walk", "--", "true"], {}),
        (["run", "--lock", "secret-walk", "--", "false"], in_env),
        (["--help"], in_env),
        (["run", "--help"], in_env),
    ]
    result = subprocess.run(
        [*py(BATCH), json.dumps(commands)],
        env=environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = [result.stderr]
    for (argv, _), (code, stdout, stderr) in zip(commands, json.loads(result.stdout), strict=True):
        assert code != 70, (argv, stderr)  # no internal error on the way
        out += [stdout, stderr]
    return out


def _serve(url: str, tmp: Path) -> list[str]:
    try:
        server = start_server(url, tmp, args=("--log-level", "info"))
    except RuntimeError as exc:  # it could not open the store: its error message
        return [str(exc)]
    out: list[str] = []
    try:
        with httpx.Client(timeout=30) as http:
            for path in ("/healthz", "/v1/info", "/v1/semaphores/secret-walk", "/"):
                response = http.get(server.base + path)
                out += [response.text, str(response.headers)]
    finally:
        server.stop()
    return [*out, server.output()]


def _demo(url: str) -> list[str]:
    result = run(
        "demo", "--url", url, "--orders", "1", "--events", "1", "--workers", "1",
        "--work-ms", "1", "--gap-ms", "0", "--no-progress", timeout=120,
    )  # fmt: skip
    assert "store: " in result.stdout, result.stdout + result.stderr
    return [result.stdout, result.stderr]


def _walk(url: str, tmp: Path, caplog: pytest.LogCaptureFixture, *, demo: bool) -> str:
    with caplog.at_level(logging.DEBUG):
        out, opened = _api(url)
    out += _cli(url)
    out += _serve(url, tmp)
    if opened and demo:
        out += _demo(url)
    out.append(caplog.text)
    return "\n".join(out)


def _check(text: str, core: str, url: str) -> None:
    assert core not in text, f"a secret of {url!r} was shown:\n" + "\n".join(
        line for line in text.splitlines() if core in line
    )
    assert "***" in text  # the URL was shown somewhere, redacted (the walk really ran)


def _params(*schemes: str) -> list[object]:
    marks = {"redis": pytest.mark.redis, "postgresql": pytest.mark.postgres}
    return [
        pytest.param(scheme, pos, id=f"{scheme}-{pos.name}", marks=marks.get(scheme, ()))
        for scheme in schemes
        for pos in POSITIONS
    ]


@pytest.mark.parametrize(("scheme", "position"), _params("memory", "sqlite", "redis", "postgresql"))
def test_no_output_path_shows_a_secret(
    scheme: str, position: Position, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if scheme == "redis" and not REDIS:
        pytest.skip("TURNSTILE_TEST_REDIS_URL is not set")
    if scheme == "postgresql" and not POSTGRES:
        pytest.skip("TURNSTILE_TEST_POSTGRES_URL is not set")
    core = secrets.token_hex(10)
    secret = f"S3c{core}"
    entry = SCHEMES[scheme]
    uid = secrets.token_hex(5)
    url = entry.make(position, secret, core, uid, tmp_path)
    try:
        _check(_walk(url, tmp_path, caplog, demo=scheme != "memory"), core, url)
    finally:
        entry.cleanup(uid)


@pytest.mark.parametrize(("scheme", "position"), _params("http"))
def test_no_output_path_shows_a_secret_of_the_http_service(
    scheme: str, position: Position, service: ServerProcess, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    url, core = _http_url(service, position)
    _check(_walk(url, tmp_path, caplog, demo=True), core, url)
    _check(service.output() + "***", core, url)  # nor the service's own log


@pytest.mark.parametrize(
    "template",
    [
        "redis://user:{s}@127.0.0.1:1/0",
        "redis://{s}@127.0.0.1:1/0",
        "rediss://:{s}@127.0.0.1:1/0?socket_connect_timeout=2",
        "redis+cluster://user:{s}@127.0.0.1:1",
        "postgresql://user:{s}@127.0.0.1:1/db?connect_timeout=2",
        "postgresql://{s}@127.0.0.1:1/db?password={s}&PASSWORD=x{s}",
        "postgresql://u@127.0.0.1:1/db?listen_url=postgresql%3A%2F%2Fu%3A{s}%40127.0.0.1%3A1%2Fdb",
        "http://:{s}@127.0.0.1:1",
        "https://{s}@127.0.0.1:1/base",
    ],
)
def test_a_store_that_cannot_be_reached_shows_no_secret(template: str) -> None:
    """The drivers' own connection errors (redis-py, psycopg, httpx), in our message, in the
    exception chained below it and on the command line's error line."""
    core = secrets.token_hex(10)
    url = template.format(s=f"S3c{core}")
    with pytest.raises(TurnstileError) as info:
        turnstile.connect(url).close()
    exc = info.value
    shown = [str(exc), repr(exc), repr(exc.args), "".join(traceback.format_exception(exc))]
    for env in ({}, {"TURNSTILE_URL": url}):
        result = run("status", *([] if env else ["--url", url]), env=env)
        assert result.returncode in (69, 78), result.stderr
        shown += [result.stdout, result.stderr]
    text = "\n".join(shown)
    assert core not in text, text
    assert "127.0.0.1" in text  # the store was named, without its secret
