"""A queue consumer for the multi-process contract tests: logs what it does, one JSON line
per event, flushed at once so a ``kill -9`` loses nothing that happened before it.

    python -m tests.contract.queue_worker '{"url": ..., "name": ..., "log": ..., ...}'

Events: ``["start", id, key, n, attempt, t]`` once a message is in hand, ``["end", id, t]``
when its work is done (before the ack), ``["ack", id, ok, t]``, ``["abandon", id, t]`` (the
thread variant's stand-in for being killed mid-message).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

import turnstile


def run(opts: dict[str, Any], client: turnstile.Client | None = None,
        abandon: threading.Event | None = None) -> None:
    own = client is None
    client = client or turnstile.connect(opts["url"])
    rnd = random.Random(opts.get("seed"))
    q = client.queue(
        opts["name"],
        visibility_timeout=opts["vt"],
        max_attempts=opts.get("max_attempts", 20),
        concurrency=opts.get("concurrency"),
    )
    lo, hi = opts.get("work_ms", (5, 25))
    deadline = time.monotonic() + opts.get("max_seconds", 120)
    gate = opts.get("gate")  # {"dir", "ready", "overlap", "hold"}: see _wait_for_others
    try:
        with open(opts["log"], "a", buffering=1) as log:
            def emit(*event: Any) -> None:
                log.write(json.dumps(event) + "\n")
                log.flush()

            if gate is not None:  # start together, however slowly the processes came up
                _wait_for_others(gate, "ready", opts["seed"], gate["ready"], deadline)
            first = True
            while not os.path.exists(opts["stop"]) and time.monotonic() < deadline:
                m = q.get(timeout=0.3)
                if m is None:
                    continue
                emit("start", m.id, m.key, m.payload["n"], m.attempt, time.time())
                if gate is not None and first:
                    # Overlap for sure: hold the first message until enough others hold one
                    # (bounded well below the visibility timeout, so it is never redelivered).
                    _wait_for_others(
                        gate, "holding", opts["seed"], gate["overlap"],
                        min(deadline, time.monotonic() + gate["hold"]),
                    )
                first = False
                time.sleep(rnd.uniform(lo, hi) / 1000)
                if abandon is not None and abandon.is_set():
                    emit("abandon", m.id, time.time())
                    return
                emit("end", m.id, time.time())
                emit("ack", m.id, m.ack(), time.time())
    finally:
        if own:
            client.close()


def _wait_for_others(
    gate: dict[str, Any], stage: str, seed: int, count: int, deadline: float
) -> None:
    """A barrier between consumer processes through files: mark this consumer as having
    reached ``stage``, then wait until ``count`` have (or ``deadline`` passes)."""
    folder = gate["dir"]
    open(os.path.join(folder, f"{stage}-{seed}"), "w").close()
    while time.monotonic() < deadline:
        if sum(name.startswith(f"{stage}-") for name in os.listdir(folder)) >= count:
            return
        time.sleep(0.005)


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
