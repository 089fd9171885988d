"""`/metrics` read by Prometheus's own parser (per-name gauges, request latency, build info)
and `turnstile serve --log-format json`, against real `turnstile serve` processes."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import turnstile
from tests.http_server import start_server

from .conftest import Served

parser = pytest.importorskip("prometheus_client.parser")

pytestmark = pytest.mark.timeout(120)


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def samples(family: Any, name: str | None = None) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for s in family.samples
        if name is None or s.name == name
    }


def test_per_name_gauges_latency_histogram_and_build_info(served: Served) -> None:
    api = served.api("admin")
    with turnstile.connect(served.url("admin")) as client:
        sem = client.semaphore("a:busy", 1, 30)
        held = sem.try_acquire("h1")
        assert held.acquired
        queued = sem.try_acquire("h2", wait_ttl=30)
        assert not queued.acquired and queued.position == 0
        with client.semaphore("a:pool", 3, 30).acquire(timeout=10):
            for _ in range(3):
                assert api.get("/healthz").status_code == 200
            text = api.get("/metrics").text
        sem.release("h1", held.lease.token if held.lease else None)
        sem.release("h2")
    found = families(text)
    assert samples(found["turnstile_holders"]) == {
        (("name", "a:busy"),): 1.0,
        (("name", "a:pool"),): 1.0,
    }
    assert samples(found["turnstile_waiters"]) == {
        (("name", "a:busy"),): 1.0,
        (("name", "a:pool"),): 0.0,
    }
    assert samples(found["turnstile_metrics_names_truncated"]) == {(): 0.0}
    [info] = found["turnstile_build_info"].samples
    assert info.labels["version"] == turnstile.__version__
    assert info.labels["python"] == platform.python_version()
    assert info.value == 1
    latency = found["turnstile_http_request_duration_seconds"]
    assert latency.type == "histogram"
    counts = samples(latency, "turnstile_http_request_duration_seconds_count")
    assert counts[(("method", "GET"), ("route", "/healthz"))] == 3
    # Every request counted by route is timed once (the blocking acquire asked too).
    assert counts[(("method", "POST"), ("route", "/v1/semaphores/try-acquire"))] >= 2
    per_route: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in samples(found["turnstile_http_requests"]).items():
        key = tuple((k, v) for k, v in labels if k != "status")
        per_route[key] = per_route.get(key, 0) + value
    assert per_route == counts
    infinite = samples(latency, "turnstile_http_request_duration_seconds_bucket")
    assert infinite[(("le", "+Inf"), ("method", "GET"), ("route", "/healthz"))] == 3
    # A tenant's scrape shows only its own names.
    b_text = served.api("tenant-b").get("/metrics").text
    assert "turnstile_holders{" not in b_text


def test_per_name_gauges_are_capped_by_metrics_names(tmp_path: Path) -> None:
    server = start_server(
        f"sqlite:///{tmp_path}/m.db",
        tmp_path,
        tokens=[{"name": "admin", "admin": True}],
        args=("--metrics-names", "2", "--observe-interval", "0"),
    )
    try:
        with turnstile.connect(server.url("admin")) as client:
            leases = [client.lock(f"n{i}", 30).acquire(timeout=10) for i in range(4)]
            import httpx

            text = httpx.get(
                f"{server.base}/metrics",
                headers={"Authorization": f"Bearer {server.tokens['admin']}"},
                timeout=30,
            ).text
            for lease in leases:
                lease.release()
    finally:
        server.stop()
    found = families(text)
    assert samples(found["turnstile_holders"]) == {(("name", "n0"),): 1.0, (("name", "n1"),): 1.0}
    assert samples(found["turnstile_metrics_names_truncated"]) == {(): 1.0}


def test_metrics_names_flag_is_checked() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "turnstile", "serve", "--metrics-names", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--metrics-names" in result.stderr and "between 0 and 10000" in result.stderr


def test_log_format_json_one_object_per_line(tmp_path: Path) -> None:
    import httpx

    ready = tmp_path / "ready"
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "turnstile", "serve",
                "--url", f"sqlite:///{tmp_path}/j.db", "--port", "0",
                "--ready-file", str(ready), "--log-format", "json",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        base = ready.read_text().strip()
        assert httpx.get(f"{base}/healthz", timeout=30).status_code == 200
        assert httpx.get(f"{base}/nowhere?x=1", timeout=30).status_code == 404
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0, log.read_text()
    lines = log.read_text("utf-8").splitlines()
    assert lines
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    access = [e for e in entries if e["logger"] == "uvicorn.access"]
    assert [(e["method"], e["path"], e["status"]) for e in access] == [
        ("GET", "/healthz", 200),
        ("GET", "/nowhere?x=1", 404),
    ]
    serving = [e for e in entries if e["logger"] == "turnstile.server"]
    assert serving and serving[0]["message"].startswith("serving sqlite:")
    assert any(e["logger"] == "uvicorn.error" for e in entries)
