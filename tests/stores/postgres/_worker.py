"""A worker process for the PostgreSQL fault tests: takes a lock in a loop and reports each
critical section (monotonic times, same clock for every process of the host) as JSON lines.

    python -m tests.stores.postgres._worker '{"url": ..., "name": ..., "iterations": N, ...}'
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import turnstile


def main() -> int:
    spec = json.loads(sys.argv[1])
    client = turnstile.connect(spec["url"])
    lock = client.lock(spec["name"], ttl=spec.get("ttl", 4.0))
    hold = spec.get("hold", 0.002)
    print(json.dumps({"event": "ready"}), flush=True)
    try:
        for i in range(spec["iterations"]):
            with lock.acquire(timeout=spec.get("timeout", 60.0)) as lease:
                start = time.monotonic()
                time.sleep(hold)
                end = time.monotonic()
                token = lease.token
            print(json.dumps({"event": "held", "i": i, "token": token, "start": start,
                              "end": end}), flush=True)
    except BaseException as exc:
        print(json.dumps({"event": "error", "error": repr(exc),
                          "traceback": traceback.format_exc()}), flush=True)
        return 1
    finally:
        client.close()
    print(json.dumps({"event": "done"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
