"""The DBOS side of ``bench_admission.py``: the workflow every caller enqueues, DBOS launched
in a worker process, and a client-side count of the SQL DBOS sends.

Imported only where DBOS runs (the benchmark's worker processes and the one-off migration),
so the benchmark itself runs without ``dbos`` installed. DBOS finds a workflow by its
registered name, and every process registers the same one here, at import.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from dbos import DBOS
from sqlalchemy import event
from sqlalchemy.engine import Engine

APP = "turnstile-bench"
WORKFLOW = "turnstile_bench_admit"

_lock = threading.Lock()
_counts = {"statements": 0, "transactions": 0, "backoffs": 0}


# Every statement and commit of every SQLAlchemy engine in this process (DBOS's system
# database engine is the only one here), from any thread: callers, queue pollers, executors.
@event.listens_for(Engine, "before_cursor_execute")
def _count_statement(*_args: Any) -> None:
    with _lock:
        _counts["statements"] += 1


@event.listens_for(Engine, "commit")
def _count_commit(*_args: Any) -> None:
    with _lock:
        _counts["transactions"] += 1


class _Backoffs(logging.Handler):
    """Counts DBOS's "Contention detected in queue thread" warnings: a poll that hit a
    serialization conflict with another process's claim, after which that process doubles
    its polling interval (and eases it back by 10% a poll)."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Contention detected"):
            with _lock:
                _counts["backoffs"] += 1


def counts() -> dict[str, int]:
    with _lock:
        return dict(_counts)


@DBOS.workflow(name=WORKFLOW)
def admit() -> float:
    """The admitted work: none; returns when it started (this process's wall clock)."""
    return time.time()


def launch(url: str, pool_size: int, *, migrate: bool = False) -> None:
    """DBOS on the system database ``url``; an executor id of this process's own, so that
    no process's launch "recovers" (re-runs) another's pending workflows."""
    DBOS(config={
        "name": APP,
        "system_database_url": url,
        "executor_id": f"bench-{os.getpid()}",
        "sys_db_pool_size": pool_size,
        "log_level": "WARNING",
        "run_migrations": migrate,
    })
    DBOS.launch()
    logging.getLogger("dbos").addHandler(_Backoffs())


def migrate(url: str) -> None:
    """Create DBOS's tables in a fresh database, once, before the workers launch."""
    launch(url, 2, migrate=True)
    DBOS.destroy()


def register_queue(name: str, limit: int, period: float, polling: float) -> Any:
    return DBOS.register_queue(name, limiter={"limit": limit, "period": period},
                               polling_interval_sec=polling)


def warm_up(queue: str, timeout: float = 15.0) -> None:
    """One workflow started directly (not through the queue: that would spend the limiter),
    then wait until this process polls ``queue`` (DBOS starts a queue's poller within a second
    of its registration)."""
    DBOS.start_workflow(admit).get_result()
    deadline = time.monotonic() + timeout
    while not any(t.name == f"queue-worker-{queue}" for t in threading.enumerate()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"DBOS did not start polling {queue} within {timeout:g} s")
        time.sleep(0.05)


def shutdown() -> None:
    DBOS.destroy()
