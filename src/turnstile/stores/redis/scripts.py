"""The Lua scripts, loaded one way for locks, queues and rate limits (no I/O; both flavours).

Redis has no includes, so each operation's script is its fast path if it has one
(``_fast_<operation>.lua``), its folder's ``_lib.lua``, then the operation's own file; the
result is sent by SHA1 (EVALSHA) and its text only when a server answers NOSCRIPT (see
``AsyncRedisConnection.run``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

LOCK_OPERATIONS = (
    "acquire",
    "release",
    "renew",
    "set_limit",
    "status",
    "probe",
    # callback grants (issue 16): a deliverer's take and settle on one name, the count of
    # pending deliveries, and the store-wide index of names with callbacks
    "take",
    "settle",
    "pending",
    "index",
)
QUEUE_OPERATIONS = (
    "put",
    "claim",
    "ack",
    "ack_claim_many",
    "nack",
    "extend",
    "stats",
    "dead",
    "requeue",
    "purge",
    "unregister",
    "names",
)
# Rate limits that wait in line (issue 15): one step, leaving the line, a snapshot.
RATE_OPERATIONS = ("acquire", "leave", "status")
# Folder under lua/ -> the operations it holds.
FOLDERS = {"lock": LOCK_OPERATIONS, "queue": QUEUE_OPERATIONS, "rate": RATE_OPERATIONS}


@dataclass(frozen=True)
class Script:
    """One operation's Lua source and its SHA1, as EVALSHA names it."""

    text: str
    sha: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode("utf-8")).hexdigest())


def script_text(folder: str, operation: str) -> str:
    """The Lua source of one operation: the folder's ``_head.lua`` (declarations every
    script of the folder shares, where there is one), the operation's fast path
    (``_fast_<operation>.lua``, where there is one: it answers the commonest case before
    the library's helpers are even made, and falls through otherwise), the folder's
    library, then the operation."""
    files = resources.files("turnstile.stores.redis").joinpath("lua", folder)
    parts = [files.joinpath(f) for f in ("_head.lua", f"_fast_{operation}.lua", "_lib.lua")]
    parts.append(files.joinpath(f"{operation}.lua"))
    return "\n".join(p.read_text("utf-8") for p in parts if p.is_file())


def load(folder: str) -> dict[str, Script]:
    """Every script of one folder (``lock``, ``queue`` or ``rate``), by operation."""
    return {op: Script(script_text(folder, op)) for op in FOLDERS[folder]}
