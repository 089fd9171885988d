"""``python manage.py rebuild_search_index``: at most one run at a time, on every host.

The lock's lease is renewed while the command works (``with lease:``), so a long rebuild
keeps it, and a crashed run frees it within ``--ttl`` seconds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

import turnstile


class Command(BaseCommand):
    help = "Rebuild the search index; only one run at a time across every host."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--wait",
            type=float,
            default=0.0,
            help="seconds to wait for a run in progress to finish (default 0: exit 1 at once)",
        )
        parser.add_argument("--ttl", type=float, default=60.0, help="lease time (renewed)")
        parser.add_argument(
            "--hold-until",
            metavar="FILE",
            help="(for the demo and tests) keep working until FILE exists",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with turnstile.connect(settings.TURNSTILE_URL) as client:
            lock = client.lock("shop:rebuild-search-index", ttl=options["ttl"])
            try:
                lease = lock.acquire(timeout=options["wait"])
            except turnstile.AcquireTimeout:
                holders = ", ".join(h.holder for h in lock.status().holders) or "someone"
                raise CommandError(
                    f"another rebuild is running ({holders}); not starting"
                ) from None
            with lease:  # renewed every ttl/3 while the block runs, released at its end
                self.stdout.write(f"rebuilding the search index (token {lease.token})", ending="\n")
                self.stdout.flush()
                self.rebuild(options["hold_until"])
            self.stdout.write("done")

    def rebuild(self, hold_until: str | None) -> None:
        # Your work goes here. The demo just waits for a file, so tests need no sleeps.
        deadline = time.monotonic() + 60
        while hold_until and not Path(hold_until).exists():
            if time.monotonic() > deadline:
                raise CommandError(f"{hold_until} never appeared")
            time.sleep(0.02)
