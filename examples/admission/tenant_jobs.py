"""Jobs of many tenants on a shared database, each sending one e-mail through a provider with
a quota: the two seed scenarios of docs/admission.md in one worker.

* the database takes at most ``TOTAL`` connections, and one tenant at most ``PER_TENANT`` of
  them: a semaphore group, so a tenant that floods the line never holds up the others;
* the e-mail provider allows ``RATE`` requests a second with bursts of ``BURST``: a rate
  limit whose callers wait in line, each woken at its slot.

Run several of these at once, on one host or many (the store comes from ``$TURNSTILE_URL``)::

    python examples/admission/tenant_jobs.py tenant-a 20 &
    python examples/admission/tenant_jobs.py tenant-b 3 &
    python examples/admission/tenant_jobs.py tenant-c 3 --urgent &

Each prints one JSON line per job: when its query ran (this host's monotonic clock) and when
the provider's quota let its e-mail go (the store's clock).
"""

from __future__ import annotations

import json
import os
import sys
import time

import turnstile

TOTAL, PER_TENANT = 4, 2
RATE, BURST = 20, 5
QUERY_SECONDS = 0.05


def run(tenant: str, jobs: int, *, urgent: bool = False) -> None:
    with turnstile.connect(os.environ.get("TURNSTILE_URL")) as client:
        database = client.semaphore_group(
            "example:database", per_key=PER_TENANT, total=TOTAL, ttl=30
        )
        provider = client.rate_limit("example:email-api", rate=RATE, per=1, burst=BURST)
        priority = 1 if urgent else 0  # urgent tenants' jobs go first in both lines
        for job in range(jobs):
            with database.acquire(tenant, timeout=120, priority=priority) as lease:
                began = time.monotonic()
                time.sleep(QUERY_SECONDS)  # the query
                ended = time.monotonic()
            sent_at = provider.acquire(timeout=120, priority=priority)  # then the e-mail
            line = {"tenant": tenant, "job": job, "token": lease.token, "began": began,
                    "ended": ended, "sent_at": sent_at}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]), urgent="--urgent" in sys.argv[3:])
