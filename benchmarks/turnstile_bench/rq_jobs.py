"""The RQ job of the queue benchmark (RQ imports a job by its module path, so it lives in a
module of its own that a consumer process can import)."""

from __future__ import annotations

from typing import Any

LAST: list[Any] = []


def record(payload: Any) -> None:
    LAST.append(payload)
