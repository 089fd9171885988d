"""The AWS side, kept to one place: boto3 clients and what AWS errors mean to us.

boto3 is the optional extra ``turnstile[aws]``. Endpoint, region and credentials come from
the standard AWS settings (environment variables such as ``AWS_ENDPOINT_URL`` and
``AWS_DEFAULT_REGION``, shared config and credentials files, profiles, instance roles): we
pass nothing of our own, so whatever works for the AWS CLI works here, including a local
emulator such as moto's server behind ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from ..errors import ConfigurationError

# SendTaskSuccess / SendTaskFailure answers that can never succeed later: the execution or
# its task is gone, or the token is not one. Anything else (throttling, 5xx, the network) may.
PERMANENT_TASK_ERRORS = frozenset({"TaskDoesNotExist", "InvalidToken", "TaskTimedOut"})
# arn:aws:states:REGION:ACCOUNT:execution:STATE_MACHINE:NAME (also express executions).
EXECUTION_ARN = re.compile(r"^arn:aws[a-z-]*:states:[a-z0-9-]+:\d{12}:(express|execution):[^:]+:")
ENDED = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"})

_lock = threading.Lock()
_clients: dict[str, Any] = {}


def boto3_module() -> Any:
    try:
        import boto3  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigurationError(
            "Step Functions and SQS need boto3: pip install 'turnstile-locks[aws]'"
        ) from None
    return boto3


def client(service: str) -> Any:
    """One boto3 client per service and process (boto3 clients are thread-safe)."""
    with _lock:
        found = _clients.get(service)
        if found is None:
            boto3 = boto3_module()
            from botocore.config import Config  # type: ignore[import-untyped]

            # Timeouts well inside a deliverer's claim (30 s by default): a send under way
            # ends, one way or the other, before another deliverer may take it again.
            found = boto3.session.Session().client(
                service,
                config=Config(
                    retries={"mode": "standard", "max_attempts": 2},
                    connect_timeout=3,
                    read_timeout=8,
                ),
            )
            _clients[service] = found
        return found


def forget_clients() -> None:
    """Drop the cached clients (tests that change AWS settings between runs)."""
    with _lock:
        _clients.clear()


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ClientError (``TaskDoesNotExist``…), else None."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None


def is_execution(holder: str) -> bool:
    """Whether ``holder`` is a Step Functions execution ARN (``$$.Execution.Id``)."""
    return bool(EXECUTION_ARN.match(holder))
