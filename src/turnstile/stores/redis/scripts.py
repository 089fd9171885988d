"""The Lua scripts, loaded one way for locks, queues and rate limits (no I/O; both flavours).

Redis has no includes, so each operation's script is its fast path if it has one
(``_fast_<operation>.lua``), its folder's ``_lib.lua``, then the operation's own file; the
result is sent by SHA1 (EVALSHA) and its text only when a server answers NOSCRIPT (see
``AsyncRedisConnection.run``).

Each folder's library (locks, queues, rate limits) starts every step with ``begin()``, so each
folder is also built as a Redis 7 function library (:func:`library`): the same files, with
the library's helpers made once when it is loaded (``FUNCTION LOAD``) rather than by every
script that runs, and each operation a function (``FCALL``). A script makes the helpers
afresh at every call (for the lock scripts about 18 µs of server time per step that does not
end on a fast path, on the benchmark's server); a function finds them made. Both run the same
code, so they answer alike; a server without functions (before Redis 7, or a user without
the right to load them) runs the scripts.
"""

from __future__ import annotations

import functools
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
class Library:
    """A folder's operations as one Redis function library: its name and ``FUNCTION LOAD``
    text. Both carry a hash of the text, so clients of different releases load libraries
    (and functions) of different names side by side, and never replace each other's."""

    name: str
    text: str


@dataclass(frozen=True)
class Script:
    """One operation's Lua source and its SHA1, as EVALSHA names it; and, for a folder built
    as a function library, the function that runs the same operation (``FCALL``) and the
    library that holds it."""

    text: str
    sha: str = ""
    function: str = ""
    library: Library | None = None  # None: a script only

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode("utf-8")).hexdigest())


def script_text(folder: str, operation: str) -> str:
    """The Lua source of one operation: ``lua/_common.lua`` (the helpers of every folder),
    the folder's ``_head.lua`` (declarations every script of the folder shares, where there
    is one), the operation's fast path
    (``_fast_<operation>.lua``, where there is one: it answers the commonest case before
    the library's helpers are even made, and falls through otherwise), the folder's
    library, then the operation."""
    head, fast, lib, body = _parts(folder, operation)
    return "\n".join(p for p in (_common(), head, fast, lib, BEGIN, body) if p)


# Every _lib.lua defines begin(), which sets the step's state afresh: a script calls it once,
# a function library at every call.
BEGIN_DEFINED = "local function begin()"
BEGIN = "begin()"
PRELOAD = "local PRELOAD = false"


@functools.cache
def _read(folder: str, name: str) -> str:
    """One Lua file of the package ("" when there is none), read once per process: every
    operation's script and the folder's library are built from the same few files, and
    each client builds them when it connects."""
    f = resources.files("turnstile.stores.redis").joinpath("lua", folder, name)
    return f.read_text("utf-8") if f.is_file() else ""


@functools.cache
def _common() -> str:
    """``lua/_common.lua``: the helpers every folder shares (``fmt``, ``server_us``), first
    in every script and library."""
    f = resources.files("turnstile.stores.redis").joinpath("lua", "_common.lua")
    return f.read_text("utf-8")


def _parts(folder: str, operation: str) -> tuple[str, str, str, str]:
    lib = _read(folder, "_lib.lua")
    if BEGIN_DEFINED not in lib:
        raise RuntimeError(f"lua/{folder}/_lib.lua defines no begin()")
    return (
        _read(folder, "_head.lua"),
        _read(folder, f"_fast_{operation}.lua"),
        lib,
        _read(folder, f"{operation}.lua"),
    )


def library(folder: str) -> tuple[Library, dict[str, str]]:
    """The folder's operations as one function library, and each operation's function name.

    The library declares ``KEYS`` and ``ARGV`` (globals in a script; a function gets them as
    arguments), then ``lua/_common.lua``, the head and the library as a script has them,
    then one Lua function per operation: its fast path, ``begin()``, its own file. Each
    registered function sets ``KEYS``, ``ARGV`` and, for locks, ``PRELOAD`` (``_head.lua``)
    and calls it, so every step starts from the same state a script starts from."""
    ops = FOLDERS[folder]
    head, _, lib, _ = _parts(folder, ops[0])
    chunks = ["local KEYS, ARGV = {}, {}", _common(), head, lib, "local OPERATIONS = {}"]
    for op in ops:
        _, fast, _, body = _parts(folder, op)
        chunks.append(f"OPERATIONS[{op!r}] = function()\n{fast}\n{BEGIN}\n{body}\nend")
    code = "\n".join(chunks)
    digest = hashlib.sha1(code.encode("utf-8")).hexdigest()[:20]
    prefix = f"turnstile_{digest}_"
    functions = {op: prefix + op for op in ops}
    # What a step must find afresh besides its keys and arguments: the head's PRELOAD (what a
    # lock's fast path read), where there is one.
    fresh = "KEYS, ARGV = keys, args"
    if PRELOAD in head:
        fresh = "KEYS, ARGV, PRELOAD = keys, args, false"
    # Unrolled: a library's code runs at load without Lua's base functions (pairs and all).
    register = "".join(
        f"redis.register_function({functions[op]!r}, function(keys, args)\n"
        f"  {fresh}\n"
        f"  return OPERATIONS[{op!r}]()\n"
        "end)\n"
        for op in ops
    )
    name = f"turnstile_{folder}_{digest}"
    text = f"#!lua name={name}\n{code}\n{register}"
    return Library(name, text), functions


def load(folder: str) -> dict[str, Script]:
    """Every script of one folder (``lock``, ``queue`` or ``rate``), by operation, with the
    function of the folder's library that runs the same step."""
    lib, functions = library(folder)
    return {
        op: Script(script_text(folder, op), function=functions[op], library=lib)
        for op in FOLDERS[folder]
    }


def function_missing(message: str) -> bool | None:
    """What an error answering FCALL means: True, the function is not loaded on that server
    (load the library, then call again); False, the server cannot run functions at all (a
    Redis before 7 knows no FCALL; a user may lack the right to it); None, anything else
    (the operation's own error)."""
    lowered = message.lower()
    if "function not found" in lowered:
        return True
    if "unknown command" in lowered or "noperm" in lowered or "no permissions" in lowered:
        return False
    return None
