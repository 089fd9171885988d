"""Start moto in server mode for tests: moto is a local emulator of the AWS APIs, NOT AWS.

``MotoServer`` runs ``python -m moto.server`` (with this interpreter, ``sys.executable``) on a
free 127.0.0.1 port, and turns on moto's interpreter of real Amazon States Language, so
that Step Functions executions actually run (Task, Pass, Wait, Choice, Parallel, Retry, Catch,
``sqs:sendMessage`` and ``sqs:sendMessage.waitForTaskToken`` ...). Nothing here talks to AWS:
the credentials are dummies and every client points at the emulator. What the emulator does
is close to AWS but not the same; the differences that matter are noted where they bite:

* ``StopExecution`` of an execution blocked in a ``.waitForTaskToken`` task does nothing
  until the token is answered or the task times out: the status stays ``RUNNING``.
* ``SendTaskFailure`` drops ``cause``; the heartbeat timeout reports ``States.Timeout``.
* An execution started without a name is named ``None`` (its ARN ends in ``:None``): a
  second unnamed execution of one state machine returns the first, or raises
  ``ExecutionAlreadyExists``. Name every execution.
* History timestamps have millisecond resolution.
* The interpreter sends its own SQS (etc.) calls to ``http://localhost:$MOTO_PORT``, so
  ``MOTO_PORT`` must be the server's port; they are signed with the access key ``ak``.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, NoReturn, Self
from urllib.parse import parse_qs, urlsplit

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"  # moto's default account
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT_ID}:role/turnstile-test"  # moto does not check it
# moto's Step Functions interpreter signs the calls it makes itself with this access key
# (moto/stepfunctions/parser/asl/utils/boto_client.py): how its calls are told from ours.
INTERPRETER_ACCESS_KEY_ID = "ak"


class MotoServer:
    """One moto server process: a local emulator of the AWS APIs (not AWS), for tests.

    >>> server = MotoServer()
    >>> sfn = server.client("stepfunctions")
    >>> server.stop()

    Its state (queues, state machines, executions) lives in the process until ``reset()``.
    The executions' interpreter runs each execution in a thread of the server process.
    """

    def __init__(self, *, execute_state_machine: bool = True, start_timeout: float = 30.0):
        self._dir = tempfile.TemporaryDirectory(prefix="turnstile-moto-")
        self._recording = Path(self._dir.name) / "recording.jsonl"
        self._log_path = Path(self._dir.name) / "server.log"
        self._execute_state_machine = execute_state_machine
        self._process: subprocess.Popen[bytes] | None = None
        self.port = 0
        try:
            self._start(start_timeout)
            self.configure()
            self.reset_recording()
        except BaseException:
            self.stop()
            raise

    @property
    def endpoint(self) -> str:
        """The emulator's URL: pass it as ``endpoint_url`` (or ``AWS_ENDPOINT_URL``)."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- process -------------------------------------------------------------------------

    def _start(self, timeout: float) -> None:
        # A free port can be taken between our probe and moto's bind: try a few.
        for _attempt in range(5):
            self.port = _free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
            env.update(
                # The interpreter calls http://localhost:$MOTO_PORT for its SQS, etc. tasks.
                MOTO_PORT=str(self.port),
                MOTO_RECORDER_FILEPATH=str(self._recording),
                AWS_ACCESS_KEY_ID=ACCESS_KEY_ID,
                AWS_SECRET_ACCESS_KEY=SECRET_ACCESS_KEY,
                AWS_DEFAULT_REGION=REGION,
                NO_PROXY=_no_proxy(env.get("NO_PROXY")),
                no_proxy=_no_proxy(env.get("no_proxy")),
            )
            with open(self._log_path, "ab") as log:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                    env=env,
                    cwd=self._dir.name,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_until_up(timeout):
                return
        raise RuntimeError(f"moto server did not start; its log:\n{self.log()}")

    def _wait_until_up(self, timeout: float) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False  # exited: most likely the port was taken
            try:
                self._request("GET", "/moto-api/config", timeout=1.0)
                return True
            except OSError:
                time.sleep(0.05)
        self._process.kill()
        self._process.wait()
        raise RuntimeError(f"moto server did not answer in {timeout}s; its log:\n{self.log()}")

    def stop(self) -> None:
        """Stop the server process and delete its files."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._dir.cleanup()

    def log(self) -> str:
        """What the server printed (one line per request): for a failing test's message."""
        try:
            return self._log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # -- moto's own API (/moto-api/...) -------------------------------------------------

    def _request(
        self, method: str, path: str, body: bytes | None = None, timeout: float = 30.0
    ) -> bytes:
        request = urllib.request.Request(self.endpoint + path, data=body, method=method)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=timeout) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"moto {method} {path}: HTTP {error.code}") from error

    def configure(self) -> None:
        """Turn moto's ASL interpreter on (or off): ``{"stepfunctions":
        {"execute_state_machine": true}}``. The switch picks which Step Functions backend
        answers, so state machines created before it is flipped are not seen after. It is
        process-wide, survives ``reset()``, and ``GET /moto-api/config`` does not show it."""
        config = {"stepfunctions": {"execute_state_machine": self._execute_state_machine}}
        self._request("POST", "/moto-api/config", json.dumps(config).encode())

    def reset(self) -> None:
        """Forget every resource (``POST /moto-api/reset``). Executions still waiting in the
        old state go on in their threads until they end or time out."""
        self._request("POST", "/moto-api/reset", b"")
        self.configure()

    # -- clients -------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """Environment variables that point an AWS SDK (or a child process) at the emulator."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self, service: str, **kwargs: Any) -> Any:
        """A boto3 client of the emulator (dummy credentials, us-east-1)."""
        import boto3  # type: ignore[import-untyped,unused-ignore]
        from botocore.config import Config  # type: ignore[import-untyped,unused-ignore]

        # No proxy from the environment; no retry (a retry would count as a second call).
        kwargs.setdefault("config", Config(proxies={}, retries={"total_max_attempts": 1}))
        return boto3.session.Session().client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            **kwargs,
        )

    # -- request recorder ----------------------------------------------------------------

    def reset_recording(self) -> None:
        self._request("POST", "/moto-api/recorder/reset-recording", b"")

    def start_recording(self, *, reset: bool = True) -> None:
        """Record every AWS request from now on (by default forgetting earlier ones)."""
        if reset:
            self.reset_recording()
        self._request("POST", "/moto-api/recorder/start-recording", b"")

    def stop_recording(self) -> None:
        self._request("POST", "/moto-api/recorder/stop-recording", b"")

    def recording(self) -> list[dict[str, Any]]:
        """The recorded requests: dicts of ``method``, ``url``, ``headers``, ``body``,
        ``body_encoded`` (the body base64-encoded)."""
        text = self._request("GET", "/moto-api/recorder/download-recording").decode()
        # One JSON object a line, but threads append concurrently: decode object by object.
        decoder = json.JSONDecoder()
        entries: list[dict[str, Any]] = []
        position = 0
        while True:
            while position < len(text) and text[position].isspace():
                position += 1
            if position >= len(text):
                return entries
            entry, position = decoder.raw_decode(text, position)
            entries.append(entry)

    def calls(self, *, interpreter: bool = False) -> Counter[str]:
        """How many times each AWS action (``"SendTaskSuccess"``, ``"DescribeExecution"``,
        ``"SendMessage"``...) was called since ``start_recording()``. The calls moto's
        Step Functions interpreter makes itself (a task's SQS ``SendMessage``) are left out
        unless ``interpreter`` is true."""
        counts: Counter[str] = Counter()
        for entry in self.recording():
            if _by_interpreter(entry) and not interpreter:
                continue
            counts[action_of(entry)] += 1
        return counts


def action_of(entry: dict[str, Any]) -> str:
    """The AWS action of one recorded request: from ``X-Amz-Target`` (JSON protocols:
    Step Functions, today's SQS) or the ``Action`` parameter (query protocol)."""
    headers = {str(k).lower(): str(v) for k, v in entry.get("headers", {}).items()}
    target = headers.get("x-amz-target")
    if target:
        return target.rsplit(".", 1)[-1]
    body = entry.get("body") or ""
    if entry.get("body_encoded"):
        body = base64.b64decode(body).decode("utf-8", "replace")
    url = urlsplit(str(entry.get("url", "")))
    for query in (str(body), url.query):
        actions = parse_qs(query).get("Action")
        if actions:
            return actions[0]
    return f"{entry.get('method', '?')} {url.path}"


def _by_interpreter(entry: dict[str, Any]) -> bool:
    headers = {str(k).lower(): str(v) for k, v in entry.get("headers", {}).items()}
    return f"Credential={INTERPRETER_ACCESS_KEY_ID}/" in headers.get("authorization", "")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _no_proxy(existing: str | None) -> str:
    hosts = ["localhost", "127.0.0.1"]
    if existing:
        hosts.append(existing)
    return ",".join(hosts)


def missing(why: str) -> NoReturn:
    """A test's server or emulator is not here: a skip on a developer's machine, a failure
    under ``CI=true`` (where the test command provides everything)."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)
