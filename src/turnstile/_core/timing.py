"""Timing policy for waiting and renewing, in one place."""

from __future__ import annotations

import itertools
import os
import secrets
import socket

from . import forks

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


# (fork generation, "host/pid/", random 48-bit start, counter) of this process.
_holders: tuple[int, str, int, itertools.count[int]] | None = None


def default_holder() -> str:
    """A holder id unique to this call, readable in ``status``: host/pid/12 hex digits.

    The digits count up from a random start drawn once per process (and again in a forked
    child), so ids are unique within a process for 2**48 calls and the host and pid keep
    them apart across processes, without a system call per acquire."""
    global _holders
    found = _holders
    if found is None or found[0] != forks.generation():
        found = _holders = (
            forks.generation(),
            f"{socket.gethostname()}/{os.getpid()}/",
            int.from_bytes(secrets.token_bytes(6), "big"),
            itertools.count(),
        )
    return f"{found[1]}{(found[2] + next(found[3])) & 0xFFFF_FFFF_FFFF:012x}"
