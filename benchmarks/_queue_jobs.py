"""The RQ job of benchmarks/bench_queue.py (RQ imports jobs by module path)."""

from __future__ import annotations

from typing import Any

LAST: list[Any] = []


def record(payload: Any) -> None:
    LAST.append(payload)
