"""The examples under examples/ run, against real stores (every store other processes can
share: the examples are multi-process by nature)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import turnstile
from tests.conftest import BackendUnderTest

pytestmark = pytest.mark.timeout(180)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def store(backend: BackendUnderTest, monkeypatch: pytest.MonkeyPatch) -> str:
    if not backend.cross_process:
        pytest.skip("memory:// is private to one process; the examples share a store")
    monkeypatch.setenv("TURNSTILE_URL", backend.url)
    return backend.url


def load(relative: str) -> ModuleType:
    """Import an example file as a fresh module (it reads $TURNSTILE_URL on import)."""
    path = EXAMPLES / relative
    name = f"example_{path.stem}_{secrets.token_hex(3)}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def overlaps(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals open at one instant."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


# -- FastAPI -----------------------------------------------------------------------------


async def test_fastapi_webhooks_of_one_order_run_one_at_a_time(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    monkeypatch.setenv("ORDER_LOCK_TIMEOUT", "120")  # a loaded test machine is slow
    module = load("fastapi_app/app.py")
    app = module.app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://example") as http:
            answers = await asyncio.gather(
                *[
                    http.post(
                        f"/webhooks/orders/{order}",
                        json={"event": f"e{n}", "work_seconds": 0.02},
                    )
                    for n in range(5)
                    for order in ("1", "2")
                ]
            )
            # The example's handler fails (500) if another webhook of its order ran meanwhile.
            assert [a.status_code for a in answers] == [200] * 10, [a.text for a in answers]
            for order in ("1", "2"):
                events = (await http.get(f"/orders/{order}")).json()["events"]
                assert sorted(e["event"] for e in events) == [f"e{n}" for n in range(5)]
                tokens = [e["token"] for e in events]
                assert tokens == sorted(tokens) and len(set(tokens)) == 5

            # A busy order answers 503 with Retry-After once its wait runs out.
            module.WAIT_TIMEOUT = 0.2
            with turnstile.connect(store) as other, other.lock("order:3").acquire(timeout=10):
                busy = await http.post("/webhooks/orders/3", json={"event": "paid"})
            assert busy.status_code == 503 and busy.headers["retry-after"] == "5"
            assert (await http.get("/orders/3")).json()["events"] == []


# -- Django ------------------------------------------------------------------------------


def _manage(*args: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / "django" / "shop" / "manage.py"), *args]


def test_django_command_runs_once_at_a_time(store: str, tmp_path: Path) -> None:
    pytest.importorskip("django")
    go = tmp_path / "go"
    first = subprocess.Popen(
        _manage("rebuild_search_index", "--hold-until", str(go)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        line = first.stdout.readline()
        assert line.startswith("rebuilding the search index (token "), (
            line,
            first.stderr.read() if first.poll() is not None and first.stderr else "",
        )
        second = subprocess.run(
            _manage("rebuild_search_index"), capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 1
        assert "another rebuild is running" in second.stderr
        # With --wait the second run takes its turn once the first is done.
        third = subprocess.Popen(
            _manage("rebuild_search_index", "--wait", "60"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with turnstile.connect(store) as client:
            lock = client.lock("shop:rebuild-search-index")
            deadline = time.monotonic() + 60
            while not lock.status().waiters:
                assert time.monotonic() < deadline, "the third run never joined the line"
                time.sleep(0.02)
        go.touch()
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        assert out.strip() == "done"
        out3, err3 = third.communicate(timeout=60)
        assert third.returncode == 0, err3
        assert out3.splitlines()[-1] == "done"
    finally:
        go.touch()
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


# -- Celery ------------------------------------------------------------------------------


def test_celery_task_semaphore_bounds_concurrency(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real Celery worker (4 prefork processes) runs 6 tasks; the semaphore lets at most 2
    render at once. Broker and results go through files: no broker server needed."""
    pytest.importorskip("celery")
    broker = tmp_path / "broker"
    broker.mkdir()
    (tmp_path / "results").mkdir()
    env = {
        "CELERY_BROKER_URL": "filesystem://",
        "CELERY_BROKER_FOLDER": str(broker),
        "CELERY_RESULT_BACKEND": f"file://{tmp_path / 'results'}",
        "RENDERERS": "2",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    folder = EXAMPLES / "celery_app"
    monkeypatch.setenv("PYTHONPATH", f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "tasks", "worker", "--concurrency", "4",
            "--pool", "prefork", "--without-heartbeat", "--without-mingle",
            "--without-gossip", "--loglevel", "WARNING",
        ],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        tasks = load("celery_app/tasks.py")
        pending = [tasks.render_invoice.delay(n, 0.3) for n in range(6)]
        results = [p.get(timeout=120) for p in pending]
    finally:
        worker.terminate()
        try:
            _, err = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
    assert sorted(r["invoice"] for r in results) == list(range(6)), err
    assert overlaps([(r["started"], r["ended"]) for r in results]) <= 2
    assert len({r["token"] for r in results}) == 6
    with turnstile.connect(store) as client:
        assert client.status("invoices:renderer").holders == ()


# -- AWS Lambda --------------------------------------------------------------------------


class FakeContext:
    """What the handler uses of Lambda's context object."""

    def __init__(self, budget_ms: int) -> None:
        self._end = time.monotonic() + budget_ms / 1000

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._end - time.monotonic()) * 1000))


def test_lambda_handler_serializes_per_order_and_gives_up_in_time(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load("aws_lambda/handler.py")
    try:
        spans: list[tuple[float, float]] = []
        real_process = module.process

        def process(order_id: str, event: dict[str, Any]) -> str:
            started = time.monotonic()
            try:
                return str(real_process(order_id, event))
            finally:
                spans.append((started, time.monotonic()))

        monkeypatch.setattr(module, "process", process)
        answers: list[dict[str, Any]] = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(
                    module.handler(
                        {"order_id": 7, "event": "paid", "work_seconds": 0.05},
                        FakeContext(60_000),
                    )
                )
            )
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert [a["statusCode"] for a in answers] == [200] * 4
        assert answers[0]["body"] == "order 7: paid"
        assert len({a["token"] for a in answers}) == 4
        assert overlaps(spans) == 1  # one invocation per order at a time

        # Busy past what the invocation has left (minus the work reserve): 409, in time.
        with turnstile.connect(store) as other, other.lock("order:8").acquire(timeout=10):
            started = time.monotonic()
            answer = module.handler({"order_id": 8}, FakeContext(3_000))
            took = time.monotonic() - started
        assert answer["statusCode"] == 409
        # It waited what the invocation had left minus the work reserve (2 s), and answered
        # before the invocation's end.
        assert 1.9 <= took < 3.0
    finally:
        module.CLIENT.close()


# -- admission: tenants on a shared database, e-mails under a quota --------------------------


def test_tenant_jobs_keep_the_per_tenant_cap_the_total_and_the_quota(store: str) -> None:
    from turnstile._core.rate_machine import max_in_window

    script = EXAMPLES / "admission" / "tenant_jobs.py"
    plan = [("tenant-a", 12, False), ("tenant-a", 12, False), ("tenant-b", 4, False),
            ("tenant-c", 4, True)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), tenant, str(jobs), *(["--urgent"] if urgent else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for tenant, jobs, urgent in plan
    ]
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err
        lines += [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 12 + 12 + 4 + 4
    example = load("admission/tenant_jobs.py")
    assert overlaps([(x["began"], x["ended"]) for x in lines]) <= example.TOTAL
    for tenant in ("tenant-a", "tenant-b", "tenant-c"):
        mine = [(x["began"], x["ended"]) for x in lines if x["tenant"] == tenant]
        assert overlaps(mine) <= example.PER_TENANT
    tokens = [x["token"] for x in lines]
    assert len(set(tokens)) == len(tokens)
    sent = [x["sent_at"] for x in lines]
    assert max_in_window(sent, 1.0) <= example.RATE + example.BURST
    assert max_in_window(sent, 1e-9) <= example.BURST
