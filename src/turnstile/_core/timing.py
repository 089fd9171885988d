"""Timing policy for waiting and renewing, in one place."""

from __future__ import annotations

import os
import secrets
import socket

# A blocked waiter re-asks at least this often, which keeps its place in line (its waiting
# entry lives ``wait_ttl``) and bounds how long a waiter whose process died can stall the
# line: its entry, or a grant handed to it and never claimed, lapses after ``wait_ttl``.
MAX_BLOCKING_WAIT_TTL = 5.0
# Renew a held lease when this fraction of its ttl has passed.
RENEW_FRACTION = 1 / 3
# Re-check a little after the earliest lease is due to expire (crashed holder).
EXPIRY_SLACK = 0.002


def blocking_wait_ttl(ttl: float) -> float:
    return min(ttl, MAX_BLOCKING_WAIT_TTL)


def heartbeat(wait_ttl: float) -> float:
    return wait_ttl / 3


def default_holder() -> str:
    """A holder id unique to this call, readable in ``status``: host/pid/random."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(6)}"
