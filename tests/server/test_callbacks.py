"""Callback grants through a real ``turnstile serve``: the ``callback`` field of try-acquire,
the service's own deliverer (signed HTTP POSTs to a receiver here), refusals, the fence around
HTTP callback hosts, what status, ``/v1/deliveries``, ``/metrics`` and the dashboard data show
(kinds only), the HTTP client backend's side, and the secret staying out of every output.

The store-level behaviour (expiries, claims, retries, Step Functions) is the contract suite's
(``tests/contract/test_callbacks.py``); here the service's part is tested end to end.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import turnstile
import turnstile.aio
from tests.http_server import ServerProcess, start_server
from turnstile import ConfigurationError, NotSupported
from turnstile._core import callbacks
from turnstile._core.callbacks import HttpCallback, StepFunctionsCallback
from turnstile.workflows.deliverer import Deliverer

from .conftest import TOKENS, Api

pytestmark = pytest.mark.timeout(120)

SECRET = "s3cret-" + secrets.token_hex(16)
TASK_TOKEN = "task-token-" + secrets.token_hex(24)
NO_AWS = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_MAX_ATTEMPTS": "1",
    "AWS_RETRY_MODE": "standard",
}
LEASE_KEYS = {"name", "holder", "token", "expires_at", "limit"}


class Receiver:
    """An HTTP callback receiver: records every POST (path, lease, whether its signature
    verified with the shared secret) and answers the status its path names (/200, /410...)."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self.received: list[tuple[str, dict[str, Any], bool]] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                signed = callbacks.verify(
                    owner.secret, body, self.headers.get(callbacks.SIGNATURE_HEADER)
                )
                with owner.lock:
                    owner.received.append((self.path, json.loads(body), signed))
                status = int(self.path.strip("/").split("/")[0])
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, status: int, tag: str) -> str:
        return f"{self.base}/{status}/{tag}"

    def got(self, tag: str) -> list[dict[str, Any]]:
        with self.lock:
            return [lease for path, lease, _ in self.received if path.endswith("/" + tag)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for(what: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET.encode())
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Over memory://, with the secret in a file, 127.0.0.1 allowed, and debug logs (the
    secret and the callbacks must stay out of them all the same)."""
    tmp = tmp_path_factory.mktemp("callbacks")
    secret_file = tmp / "callback-secret"
    secret_file.write_text(SECRET + "\n", "utf-8")
    with pytest.MonkeyPatch.context() as env:
        env.delenv("TURNSTILE_CALLBACK_SECRET", raising=False)
        # No AWS here: Step Functions deliveries fail at once (and are retried) instead of
        # looking for credentials on an instance metadata service.
        for key, value in NO_AWS.items():
            env.setenv(key, value)
        proc = start_server(
            "memory://",
            tmp,
            tokens=[dict(t) for t in TOKENS],
            args=(
                "--callback-secret-file", str(secret_file),
                "--callback-hosts", "127.0.0.1",
                "--log-level", "debug",
                "--observe-interval", "0.5",
            ),
        )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def api(server: ServerProcess) -> Iterator[Api]:
    client = Api(server, "admin")
    try:
        yield client
    finally:
        client.close()


def ask(api: Api, name: str, holder: str, callback: Any = None, **extra: Any) -> Any:
    body = {"name": name, "holder": holder, "ttl": 60, **extra}
    if callback is not None:
        body["callback"] = callback
    return api.ok("/v1/locks/try-acquire", body)


def status(api: Api, name: str) -> Any:
    return api.ok("/v1/locks/status", {"name": name})


def test_grants_are_delivered_signed_and_in_order_as_holders_release(
    api: Api, receiver: Receiver
) -> None:
    name = "a:ordered"
    first = ask(api, name, "first")
    assert first["acquired"]
    for i, holder in enumerate(["w1", "w2", "w3"]):
        ticket = ask(api, name, holder, {"kind": "http", "url": receiver.url(200, holder)})
        assert (ticket["acquired"], ticket["position"]) == (False, i)
    found = status(api, name)
    assert [(w["holder"], w["callback"]) for w in found["waiters"]] == [
        ("w1", "http"), ("w2", "http"), ("w3", "http"),
    ]
    assert receiver.url(200, "w1") not in json.dumps(found)

    token = first["lease"]["token"]
    previous = "first"
    for holder in ["w1", "w2", "w3"]:
        assert api.ok("/v1/locks/release", {"name": name, "holder": previous, "token": token})[
            "released"
        ]
        [lease] = wait_for(lambda h=holder: receiver.got(h))  # type: ignore[misc]
        assert set(lease) == LEASE_KEYS
        assert (lease["name"], lease["holder"], lease["limit"]) == (name, holder, 1)
        assert lease["token"] > token
        token = lease["token"]
        holders = wait_for(
            lambda: [
                (h["holder"], h["token"], h["callback"], h["delivery"])
                for h in status(api, name)["holders"]
                if h.get("delivery") == "delivered"
            ]
        )
        assert holders == [(holder, token, "http", "delivered")]
        previous = holder
    # Each was delivered once, signed with the shared secret, in line order.
    with receiver.lock:
        mine = [(p, lease["holder"], ok) for p, lease, ok in receiver.received
                if lease["name"] == name]
    assert [(h, ok) for _, h, ok in mine] == [("w1", True), ("w2", True), ("w3", True)]
    assert api.ok("/v1/locks/release", {"name": name, "holder": "w3", "token": token})["released"]


def test_a_refusal_releases_the_grant_and_serves_the_next(api: Api, receiver: Receiver) -> None:
    name = "a:refused"
    first = ask(api, name, "first")
    ask(api, name, "gone", {"kind": "http", "url": receiver.url(410, "gone")})
    ask(api, name, "next", {"kind": "http", "url": receiver.url(200, "next")})
    api.ok("/v1/locks/release", {"name": name, "holder": "first", "token": first["lease"]["token"]})
    [lease] = wait_for(lambda: receiver.got("next"))
    assert lease["holder"] == "next"
    assert len(receiver.got("gone")) == 1  # refused once, never retried
    found = status(api, name)
    assert [h["holder"] for h in found["holders"]] == ["next"]
    assert found["waiters"] == []
    api.ok("/v1/locks/release", {"name": name, "holder": "next"})


def test_a_free_name_grants_a_callback_at_once_and_delivers_it(
    api: Api, receiver: Receiver
) -> None:
    ticket = ask(api, "a:free", "now", {"kind": "http", "url": receiver.url(200, "now")})
    assert ticket["acquired"] and ticket["lease"]["holder"] == "now"
    [lease] = wait_for(lambda: receiver.got("now"))
    assert lease["token"] == ticket["lease"]["token"]
    api.ok("/v1/locks/release", {"name": "a:free", "holder": "now"})


@pytest.mark.parametrize(
    ("callback", "expected"),
    [
        ({"kind": "smtp", "to": "x"}, "callback.kind must be 'sfn' or 'http'"),
        ({"task_token": "x"}, "callback.kind"),
        ({"kind": {}, "task_token": "x"}, "callback.kind must be 'sfn' or 'http'"),
        ({"kind": "sfn"}, "callback.task_token must be a non-empty string"),
        ({"kind": "sfn", "task_token": "x" * 1025}, "callback.task_token must be at most 1024"),
        ({"kind": "sfn", "task_token": "a\nb"}, "callback.task_token must not contain control"),
        ({"kind": "sfn", "task_token": "x", "url": "http://x"}, "callback has unknown field"),
        ({"kind": "http", "url": "ftp://127.0.0.1/x"}, "callback.url must be an http:// or"),
        ({"kind": "http", "url": "http://u:p@127.0.0.1/x"}, "callback.url must not carry"),
        ({"kind": "http", "url": "https://example.com/x"}, "callback.url: host 'example.com'"),
        ({"kind": "http", "url": "http://10.0.0.7/x"}, "callback.url: host '10.0.0.7' is not"),
        ({"kind": "http", "url": 7}, "callback.url must be a non-empty string"),
        ("sfn", "callback must be an object, got a string"),
        (None, "callback must be an object, got null"),
        ([], "callback must be an object, got an array"),
    ],
)
def test_the_callback_field_is_checked_and_named(
    api: Api, callback: Any, expected: str
) -> None:
    body = {"name": "a:checked", "holder": "h", "callback": callback}
    message = api.error(api.post("/v1/locks/try-acquire", body), 422, "invalid_argument")
    assert expected in message, message
    assert status(api, "a:checked")["waiters"] == []


def test_a_callback_always_waits_in_line(api: Api) -> None:
    body = {"name": "a:nowait", "holder": "h", "enqueue": False,
            "callback": {"kind": "sfn", "task_token": TASK_TOKEN}}
    message = api.error(api.post("/v1/locks/try-acquire", body), 422, "invalid_argument")
    assert "enqueue" in message


def test_status_dashboard_and_deliveries_show_kinds_never_tokens_or_urls(
    server: ServerProcess, api: Api, receiver: Receiver
) -> None:
    name = "a:shown"
    first = ask(api, name, "first")
    # Nobody delivers to this Step Functions token (no AWS here): the grant stays pending.
    ask(api, name, "sfn-waiter", {"kind": "sfn", "task_token": TASK_TOKEN})
    ask(api, name, "http-waiter", {"kind": "http", "url": receiver.url(200, "shown-secret-path")})
    found = status(api, name)
    assert [(w["holder"], w["callback"]) for w in found["waiters"]] == [
        ("sfn-waiter", "sfn"), ("http-waiter", "http"),
    ]
    assert "callback" not in found["holders"][0]
    api.ok("/v1/locks/release", {"name": name, "holder": "first", "token": first["lease"]["token"]})
    holder = wait_for(lambda: status(api, name)["holders"])[0]
    assert (holder["holder"], holder["callback"], holder["delivery"]) == (
        "sfn-waiter", "sfn", "pending",
    )
    # The SDK is not installed or finds no AWS: the delivery is retried, and counted as
    # pending over the store (sampled about once a second).
    deliveries = wait_for(lambda: (d := api.ok("/v1/deliveries"))["pending"] and d)
    assert deliveries["pending"] >= 1
    assert deliveries["deliverer"]["running"] is True
    dashboard = api.ok("/v1/dashboard")
    [card] = [s for s in dashboard["names"] if s["name"] == name]
    assert card["holders"][0]["callback"] == "sfn"
    assert dashboard["instance"]["deliveries"]["running"] is True
    for answer in (json.dumps(status(api, name)), json.dumps(dashboard), json.dumps(deliveries)):
        assert TASK_TOKEN not in answer and "shown-secret-path" not in answer
        assert SECRET not in answer
    api.ok("/v1/admin/force-release", {"name": name})


def test_metrics_show_pending_outcomes_and_latency(
    server: ServerProcess, api: Api, receiver: Receiver
) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    name = "a:metered"
    first = ask(api, name, "first")
    ask(api, name, "m1", {"kind": "http", "url": receiver.url(200, "m1")})
    ask(api, name, "m2", {"kind": "http", "url": receiver.url(404, "m2")})
    api.ok("/v1/locks/release", {"name": name, "holder": "first", "token": first["lease"]["token"]})
    wait_for(lambda: receiver.got("m1"))
    api.ok("/v1/locks/release", {"name": name, "holder": "m1"})
    wait_for(lambda: receiver.got("m2"))

    def scrape() -> dict[str, Any]:
        text = api.get("/metrics").text
        return {f.name: f for f in parser.text_string_to_metric_families(text)}

    def outcomes() -> dict[str, float]:
        found = scrape()["turnstile_deliveries"]
        return {s.labels["outcome"]: s.value for s in found.samples
                if s.name == "turnstile_deliveries_total"}

    counts = wait_for(lambda: (c := outcomes())["refused"] >= 1 and c)
    assert set(counts) == {"delivered", "refused", "retried", "lost"}
    assert counts["delivered"] >= 1
    families = scrape()
    assert families["turnstile_deliveries_pending"].type == "gauge"
    [pending] = families["turnstile_deliveries_pending"].samples
    assert pending.value >= 0
    latency = families["turnstile_delivery_seconds"]
    assert latency.type == "histogram"
    [count] = [s for s in latency.samples if s.name == "turnstile_delivery_seconds_count"]
    assert count.value == counts["delivered"]


def test_the_http_client_backend_asks_with_callbacks_and_leaves_delivery_to_the_service(
    server: ServerProcess, receiver: Receiver
) -> None:
    with turnstile.connect(server.url("admin")) as client:
        assert client.characteristics.local_deliveries is False
        backend = client.backend
        with pytest.raises(NotSupported, match="delivers its own callback"):
            backend.take_deliveries(lease=30, max_count=10)
        with pytest.raises(NotSupported, match="delivers its own callback"):
            backend.settle_delivery("a:x", 1, outcome="delivered", retry_in=1)
        assert isinstance(backend.pending_deliveries(), int)

        sem = client.semaphore("a:client", 1, ttl=60)
        held = sem.try_acquire("mine")
        assert held.acquired and held.lease is not None
        ticket = sem.try_acquire("remote", callback=HttpCallback(receiver.url(200, "client")))
        assert not ticket.acquired and ticket.position == 0
        ticket = sem.try_acquire("remote", callback=HttpCallback(receiver.url(200, "client")))
        assert ticket.position == 0  # asking again keeps the place
        [waiter] = sem.status().waiters
        assert (waiter.holder, waiter.callback) == ("remote", "http")
        with pytest.raises(turnstile.InvalidArgument, match=r"callback\.url: host"):
            sem.try_acquire("x", callback=HttpCallback("http://192.168.1.1/x"))
        sem.release("mine", held.lease.token)
        [lease] = wait_for(lambda: receiver.got("client"))
        assert lease["holder"] == "remote"
        holders = wait_for(
            lambda: [(h.holder, h.callback, h.delivery) for h in sem.status().holders
                     if h.delivery == "delivered"]
        )
        assert holders == [("remote", "http", "delivered")]
        sem.release("remote", lease["token"])

    async def deliver_over_http() -> None:
        async with await turnstile.aio.connect(server.url("admin")) as aclient:
            with pytest.raises(ConfigurationError, match="deliver their own callbacks"):
                Deliverer(aclient.backend)

    asyncio.run(deliver_over_http())


def test_the_secret_never_appears_in_the_service_output(
    server: ServerProcess, api: Api, receiver: Receiver
) -> None:
    # This test's own delivery and refusal (the module's other tests may run on another
    # worker's server), logged at debug level; then a few more things.
    name = "a:secret"
    first = ask(api, name, "first")
    ask(api, name, "nope", {"kind": "http", "url": receiver.url(410, "secret-nope")})
    ask(api, name, "yes", {"kind": "http", "url": receiver.url(200, "secret-yes")})
    api.ok("/v1/locks/release", {"name": name, "holder": "first", "token": first["lease"]["token"]})
    wait_for(lambda: receiver.got("secret-yes"))
    api.ok("/v1/locks/release", {"name": name, "holder": "yes"})
    api.ok("/v1/info")
    api.get("/metrics")
    output = wait_for(
        lambda: (lambda out: out if "refused" in out and "delivered" in out else None)(
            server.output()
        )
    )  # the debug log is there
    assert SECRET not in output
    assert TASK_TOKEN not in output
    assert SECRET not in api.get("/openapi.json").text


# -- without an allow-list, without a secret, without a deliverer -----------------------------


def test_without_callback_hosts_only_public_hosts_and_with_the_secret_from_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNSTILE_CALLBACK_SECRET", SECRET)
    proc = start_server("memory://", tmp_path, tokens=[{"name": "admin", "admin": True}])
    api = Api(proc, "admin")
    try:
        for url in (
            "http://127.0.0.1:9/x", "http://localhost/x", "http://api.localhost/x",
            "http://[::1]/x", "http://169.254.169.254/latest/meta-data", "http://10.1.2.3/x",
            "http://192.168.0.1/x", "http://[::ffff:127.0.0.1]/x", "http://0.0.0.0/x",
        ):
            body = {"name": "n", "holder": "h", "callback": {"kind": "http", "url": url}}
            message = api.error(api.post("/v1/locks/try-acquire", body), 422, "invalid_argument")
            assert "callback.url" in message and "not a public address" in message, message
        # A public host is accepted (the grant is delivered, or retried, there).
        body = {"name": "n", "holder": "h", "ttl": 5,
                "callback": {"kind": "http", "url": "https://hooks.example.com/grant"}}
        assert api.ok("/v1/locks/try-acquire", body)["acquired"]
        api.ok("/v1/locks/release", {"name": "n", "holder": "h"})
        assert SECRET not in proc.output()
    finally:
        api.close()
        proc.stop()


def test_without_a_secret_http_callbacks_are_refused_and_with_no_deliver_none_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TURNSTILE_CALLBACK_SECRET", raising=False)
    proc = start_server("memory://", tmp_path, tokens=[{"name": "admin", "admin": True}],
                        args=("--no-deliver",))
    api = Api(proc, "admin")
    try:
        body = {"name": "n", "holder": "h",
                "callback": {"kind": "http", "url": "https://hooks.example.com/x"}}
        message = api.error(api.post("/v1/locks/try-acquire", body), 422, "invalid_argument")
        assert "callback.url" in message and "no callback secret" in message
        body = {"name": "n", "holder": "h", "callback": {"kind": "sfn", "task_token": TASK_TOKEN}}
        assert api.ok("/v1/locks/try-acquire", body)["acquired"]
        time.sleep(0.3)
        [holder] = status(api, "n")["holders"]
        assert holder["delivery"] == "pending"  # nobody delivers here
        deliveries = wait_for(lambda: (d := api.ok("/v1/deliveries"))["pending"] and d)
        assert deliveries["pending"] == 1 and deliveries["deliverer"]["running"] is False
    finally:
        api.close()
        proc.stop()


def test_serve_refuses_a_missing_or_weak_secret_file_without_showing_it(tmp_path: Path) -> None:
    weak = tmp_path / "weak"
    weak.write_text("short-one\n", "utf-8")
    for path, expected in ((weak, "use at least 16"), (tmp_path / "absent", "cannot read")):
        done = subprocess.run(
            [sys.executable, "-m", "turnstile.server", "--url", "memory://", "--port", "0",
             "--callback-secret-file", str(path)],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 78, done.stderr
        assert expected in done.stderr and "short-one" not in done.stderr


def test_step_functions_callbacks_are_accepted_without_a_secret() -> None:
    # The form is the library's (no network): a Step Functions callback needs no secret.
    assert isinstance(
        callbacks.from_fields({"kind": "sfn", "task_token": TASK_TOKEN}), StepFunctionsCallback
    )


def test_the_dashboard_shows_callback_badges(server: ServerProcess, api: Api) -> None:
    from .conftest import chromium_path

    chromium = chromium_path()
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the dev group")
    name = "a:badges"
    first = ask(api, name, "first")
    ask(api, name, "sfn-holder", {"kind": "sfn", "task_token": TASK_TOKEN})
    ask(api, name, "http-waiter", {"kind": "http", "url": "http://127.0.0.1:9/badge-path"})
    api.ok("/v1/locks/release", {"name": name, "holder": "first", "token": first["lease"]["token"]})
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium, headless=True,
                args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
            )
            try:
                page = browser.new_page()
                page.goto(server.base + "/")
                page.fill("#token", server.tokens["admin"])
                page.click("#token-form button")
                card = page.locator(f"[data-testid=name][data-name='{name}']")
                card.locator("[data-testid=holder] [data-testid=callback]").wait_for(
                    timeout=10_000
                )
                holder_badge = card.locator("[data-testid=holder] [data-testid=callback]")
                assert holder_badge.inner_text() == "sfn · pending"
                waiter_badge = card.locator("[data-testid=waiter] [data-testid=callback]")
                assert waiter_badge.inner_text() == "http"
                text = page.content()
                assert TASK_TOKEN not in text and "badge-path" not in text
            finally:
                browser.close()
    finally:
        api.ok("/v1/admin/force-release", {"name": name})


# -- execution status-change events (issue 16 point 4a, POSTed to the service) ---------------

EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:machine:run-{}"


def _event(arn: str, status: str) -> dict[str, Any]:
    """An EventBridge "Step Functions Execution Status Change" event, in AWS's format (the
    emulator sends none: this is the documented shape)."""
    return {
        "version": "0",
        "id": secrets.token_hex(8),
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": "123456789012",
        "time": "2026-11-25T10:00:00Z",
        "region": "us-east-1",
        "resources": [arn],
        "detail": {
            "executionArn": arn,
            "stateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:machine",
            "name": arn.rsplit(":", 1)[1],
            "status": status,
            "startDate": 1795600000000,
            "stopDate": 1795600001000,
        },
    }


def test_an_ended_execution_posted_as_an_event_frees_its_permits_at_once(
    sqlite_served: Any,
) -> None:
    admin = sqlite_served.api("admin")
    name = "events:" + secrets.token_hex(4)
    dead, waiting, next_one = (EXECUTION.format(i) for i in ("dead", "waiting", "next"))

    def ask(holder: str) -> Any:
        return admin.ok(
            "/v1/semaphores/try-acquire",
            {"name": name, "limit": 1, "ttl": 3600, "holder": holder},
        )

    held = ask(dead)
    assert held["acquired"]
    assert not ask(waiting)["acquired"] and not ask(next_one)["acquired"]
    # Still running: nothing happens.
    running = admin.ok("/v1/events/stepfunctions", _event(dead, "RUNNING"))
    assert running["execution"] is None
    # Aborted with no Catch: its grant goes at once (scoped by its token), the next is served.
    freed = admin.ok("/v1/events/stepfunctions", _event(dead, "ABORTED"))
    assert freed["execution"] == dead
    assert freed["grants"] == [{"name": name, "token": held["lease"]["token"]}]
    status = admin.ok("/v1/semaphores/status", {"name": name})
    assert [h["holder"] for h in status["holders"]] == [waiting]
    # An execution that died while waiting leaves the line.
    gone = admin.ok("/v1/events/stepfunctions", _event(next_one, "TIMED_OUT"))
    assert gone["places"] == [name]
    assert admin.ok("/v1/semaphores/status", {"name": name})["waiters"] == []
    # Repeated (EventBridge delivers at least once): harmless.
    again = admin.ok("/v1/events/stepfunctions", _event(dead, "ABORTED"))
    assert again["grants"] == [] and again["places"] == []
    # Another kind of event is acknowledged and ignored.
    other = {**_event(waiting, "FAILED"), "detail-type": "EC2 Instance State-change"}
    assert admin.ok("/v1/events/stepfunctions", other)["execution"] is None
    assert [h["holder"] for h in admin.ok("/v1/semaphores/status", {"name": name})["holders"]] == [
        waiting
    ]


def test_events_need_an_admin_token_and_a_well_formed_body(sqlite_served: Any) -> None:
    event = _event(EXECUTION.format("x"), "FAILED")
    tenant = sqlite_served.api("tenant-a")
    tenant.error(tenant.post("/v1/events/stepfunctions", event), 403, "admin_required")
    admin = sqlite_served.api("admin")
    admin.error(admin.post("/v1/events/stepfunctions", {"detail": {}}), 422, "invalid_argument")
    bad = {**event, "detail": "not an object"}
    admin.error(admin.post("/v1/events/stepfunctions", bad), 422, "invalid_argument")
