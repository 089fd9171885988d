"""Schemathesis against the served OpenAPI document: for every operation, generated requests
(valid and invalid) never get a 5xx, and every answer matches the document (status code,
content type, body schema). Example counts are kept modest so this runs in a minute or two."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="the dev group")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402

from tests.http_server import ServerProcess, start_server  # noqa: E402
from turnstile._core import validate  # noqa: E402
from turnstile._core.validate import MAX_HOLDER_BYTES, MAX_NAME_BYTES  # noqa: E402

EXAMPLES = int(os.environ.get("TURNSTILE_SCHEMATHESIS_EXAMPLES", "30"))


@pytest.fixture(scope="module")
def schema_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    # Short long-polls: the document then allows at most 1 s of waiting per request.
    server = start_server(
        f"sqlite:///{tmp}/turnstile.db",
        tmp,
        tokens=[{"name": "admin", "admin": True}],
        args=("--max-wait", "1", "--max-body", "65536"),
    )
    try:
        yield server
    finally:
        server.stop()


def within_byte_limits(case: Any) -> bool:
    """Names and holders are limited in UTF-8 bytes, which JSON Schema cannot express (its
    maxLength counts characters; the document states the byte limits in words). Valid-data
    cases over the byte limits are not valid, so they are dropped here."""
    body = case.body if isinstance(case.body, dict) else {}
    values = {**body, **(case.query or {})}
    limits = (
        ("name", MAX_NAME_BYTES),
        ("holder", MAX_HOLDER_BYTES),
        ("queue", MAX_NAME_BYTES),
        ("key", validate.MAX_KEY_BYTES),
        ("dedup_id", validate.MAX_DEDUP_ID_BYTES),
        ("id", 256),
        ("receipt", 256),
    )

    def too_long(value: object, limit: int) -> bool:
        return isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) > limit

    for field, limit in limits:
        if too_long(values.get(field), limit):
            return False
    ids = values.get("ids")
    return not (isinstance(ids, list) and any(too_long(i, 256) for i in ids))


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_api_conforms_to_its_document(schema_server: ServerProcess, mode: str) -> None:
    """Every operation, with generated valid (positive) or invalid (negative) requests. The
    operations are driven one by one with Hypothesis directly (schemathesis' own pytest
    plugin does not run under pytest 9)."""
    # A body over the service's --max-body is refused with 413 before it is parsed: a
    # rejection of invalid data like any 4xx (generated arrays over maxItems can be that big).
    rejections = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422"]
    config = SchemathesisConfig.from_dict(
        {
            "checks": {
                "negative_data_rejection": {
                    "expected-statuses": [*rejections, "428", "429", "5xx"]
                }
            }
        }
    )
    schema = schemathesis.openapi.from_url(schema_server.base + "/openapi.json", config=config)
    headers = {"Authorization": f"Bearer {schema_server.tokens['admin']}"}
    generation = GenerationMode(mode)
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        strategy = operation.as_strategy(generation_mode=generation)
        if generation is GenerationMode.POSITIVE:
            strategy = strategy.filter(within_byte_limits)

        @given(case=strategy)
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],
        )
        def check(case: Any) -> None:
            case.call_and_validate(headers=headers, timeout=15)

        try:
            check()
        except Unsatisfiable:
            # No invalid input exists for an operation without parameters (e.g. /healthz).
            assert generation is GenerationMode.NEGATIVE, operation.path
        except Exception as exc:
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}")
    assert operations >= 27
    assert not failures, "\n\n".join(failures)


# Every check schemathesis has (``-c all``: ST201 negative data rejected, ST202 positive
# data accepted, ST203 required header, ST204 undeclared methods answer 405 with `Allow`,
# conformance of status, content type, headers and body, auth and resource checks), over
# its examples, coverage and fuzzing phases, positive and negative data.
CLI_EXAMPLES = int(os.environ.get("TURNSTILE_SCHEMATHESIS_CLI_EXAMPLES", "8"))
# 413: a generated array beyond `maxItems` can also be beyond the service's body limit, and
# 408/413 are rejections too (the default list lacks them).
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "408", "409", "413", "415",
                     "422", "428", "429"]
"""


def test_api_passes_every_schemathesis_check(
    schema_server: ServerProcess, tmp_path: Path
) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG, "utf-8")
    command = [
        sys.executable, "-c", "import sys; from schemathesis.cli import schemathesis; "
        "sys.exit(schemathesis())",
        "--config-file", str(config), "--no-color",
        "run", schema_server.base + "/openapi.json",
        "--checks", "all",
        "--phases", "examples,coverage,fuzzing",
        "--mode", "all",
        "--max-examples", str(CLI_EXAMPLES),
        "--generation-deterministic",
        "--request-timeout", "15",
        "--continue-on-failure",
        "--header", f"Authorization: Bearer {schema_server.tokens['admin']}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    report = done.stdout[-20000:] + done.stderr[-5000:]
    assert done.returncode == 0, report
    assert re.search(r"Tested: (\d+)", report) and int(
        re.search(r"Tested: (\d+)", report).group(1)  # type: ignore[union-attr]
    ) >= 27, report
    assert "ST204" not in report and "Coverage" in report, report


def test_document_is_served_and_complete(schema_server: ServerProcess, tmp_path: Path) -> None:
    import httpx

    document = httpx.get(schema_server.base + "/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    paths = set(document["paths"])
    for kind in ("locks", "semaphores"):
        for op in ("acquire", "try-acquire", "renew", "release", "status"):
            assert f"/v1/{kind}/{op}" in paths
    assert {"/v1/names", "/v1/info", "/healthz", "/metrics", "/v1/admin/force-release"} <= paths
    # The configured long-poll bound is what the document says.
    acquire = document["paths"]["/v1/locks/acquire"]["post"]["requestBody"]["content"]
    wait = acquire["application/json"]["schema"]["properties"]["wait"]
    assert wait["maximum"] == 1
