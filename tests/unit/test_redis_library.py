"""The Redis scripts as function libraries (stores/redis/scripts.py): built from the same
files as the scripts, and every step starting from the state a script starts from. No server:
tests/stores/redis runs both on real ones."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest

from turnstile.stores.redis import scripts

LUA_ROOT = resources.files("turnstile.stores.redis").joinpath("lua")


def _top_level_locals(text: str) -> dict[str, bool]:
    """The names a file declares at its top level (not functions), and whether with a value."""
    found: dict[str, bool] = {}
    for line in text.splitlines():
        m = re.match(r"local (?!function)([A-Za-z_][\w, ]*?)\s*(=|--|$)", line)
        if m:
            for name in m.group(1).split(","):
                found[name.strip()] = m.group(2) == "="
    return found


def _begin_body(lib: str) -> str:
    start = lib.index("local function begin()")
    return lib[start : lib.index("\nend\n", start)]


@pytest.mark.parametrize("folder", sorted(scripts.FOLDERS))
def test_every_variable_a_step_changes_is_set_afresh_by_begin(folder: str) -> None:
    # A function library makes the helpers once, so whatever a step leaves in a top-level
    # variable the next step would find: begin() must set every one a step may change, and
    # the rest must be constants (a value at declaration, never assigned again).
    lua = LUA_ROOT.joinpath(folder)
    lib = lua.joinpath("_lib.lua").read_text("utf-8")
    begin = _begin_body(lib)
    assigned_in_begin = set(re.findall(r"^\s+([A-Za-z_][\w, ]*?)\s*=", begin, re.M))
    reset = {n.strip() for group in assigned_in_begin for n in group.split(",")}
    rest = lib.replace(begin, "")
    for name, constant in _top_level_locals(lib).items():
        if constant:
            assert not re.search(rf"^\s+{name}\s*=", rest, re.M), f"{name} is changed"
        else:
            assert name in reset, f"begin() does not set {name}"
    head_file = lua.joinpath("_head.lua")
    head = head_file.read_text("utf-8") if head_file.is_file() else ""
    for name, constant in _top_level_locals(head).items():
        assert constant, name
        changed = re.search(rf"^\s+{name}\s*=", head + lib, re.M)
        # PRELOAD, which a fast path sets, is set afresh by each registered function.
        assert not changed or name == "PRELOAD", f"{name} is changed"
    built = scripts.library(folder)
    fresh = "KEYS, ARGV, PRELOAD = keys, args, false" if "PRELOAD" in head else "KEYS, ARGV = keys,"
    assert built[0].text.count(fresh) == len(scripts.FOLDERS[folder])
    # Nothing but declarations runs when the library is loaded (no redis.call: Redis refuses
    # it there): every command is inside a function.
    assert not re.search(r"^(local \w+ = )?redis\.call", lib + head, re.M)


@pytest.mark.parametrize("folder", sorted(scripts.FOLDERS))
def test_a_library_holds_every_operation_under_names_of_its_own(folder: str) -> None:
    library, functions = scripts.library(folder)
    assert set(functions) == set(scripts.FOLDERS[folder])
    digest = library.name.removeprefix(f"turnstile_{folder}_")
    assert library.text.startswith(f"#!lua name={library.name}\n")
    for op, function in functions.items():
        assert function == f"turnstile_{digest}_{op}"
        assert f"redis.register_function({function!r}," in library.text
    # The same text, the same names; another text (another release), other names.
    assert scripts.library(folder)[0] == library
    loaded = scripts.load(folder)
    assert all(s.library == library and s.function == functions[op] for op, s in loaded.items())


def test_the_libraries_name_their_functions_apart() -> None:
    names = [f for folder in scripts.FOLDERS for f in scripts.load(folder).values()]
    assert len({s.function for s in names}) == len(names)


@pytest.mark.parametrize("folder", sorted(scripts.FOLDERS))
def test_each_script_runs_begin_after_its_fast_path_and_before_its_step(folder: str) -> None:
    LUA = LUA_ROOT.joinpath(folder)
    for op, script in scripts.load(folder).items():
        text = script.text
        begin = text.index("\nbegin()\n")
        assert text.index("local function begin()") < begin, op
        fast = LUA.joinpath(f"_fast_{op}.lua")
        if fast.is_file():
            assert text.index(fast.read_text("utf-8")) < begin, op
        assert text.endswith(LUA.joinpath(f"{op}.lua").read_text("utf-8")), op


def test_what_an_fcall_error_means() -> None:
    assert scripts.function_missing("Function not found") is True
    assert scripts.function_missing("ERR Function not found") is True
    assert scripts.function_missing("unknown command 'FCALL', with args beginning with:") is False
    assert scripts.function_missing("NOPERM User x has no permissions to run 'fcall'") is False
    assert scripts.function_missing("TURNSTILE name-collision: two names share") is None


def test_the_shared_helpers_are_in_one_file_first_in_every_script_and_library() -> None:
    common = LUA_ROOT.joinpath("_common.lua").read_text("utf-8")
    # Only declarations (no top-level variable a step could change).
    assert not _top_level_locals(common)
    helpers = re.findall(r"^local function (\w+)", common, re.M)
    assert helpers == ["fmt", "server_us"]
    for folder, operations in scripts.FOLDERS.items():
        for name in ("_head.lua", "_lib.lua"):
            f = LUA_ROOT.joinpath(folder, name)
            text = f.read_text("utf-8") if f.is_file() else ""
            for helper in helpers:
                assert f"local function {helper}(" not in text, (folder, name, helper)
            assert "redis.call('TIME')" not in text, (folder, name)  # server_us() only
        for operation in operations:
            assert scripts.script_text(folder, operation).startswith(common)
        lib = scripts.library(folder)[0].text
        assert lib.index(common) < lib.index("local OPERATIONS")


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_pack_makes_the_bytes_redis_py_makes(flavour: str) -> None:
    """driver.pack (hiredis straight away) sends exactly what redis-py's packer would, for
    the arguments the backends send (strings, non-ASCII ones, integers, bytes, empty), and
    is redis-py's own packer when the connection has another (no hiredis)."""
    import redis
    import redis.asyncio
    from redis.connection import PythonRespSerializer

    from turnstile.stores.redis import driver

    client: Any = redis.Redis() if flavour == "sync" else redis.asyncio.Redis()
    conn = client.connection_pool.make_connection()  # not connected: packing needs no server
    args = ("FCALL", "turnstile_acquire_v2", 2, "ts:{n}:d", "ts:{n}:l", "h/1/ab", "ñame ü", 0,
            -12, 30000, b"\x00\xffraw", "", "1")
    assert b"".join(driver.pack(conn, args)) == b"".join(conn.pack_command(*args))
    if flavour == "sync":
        assert len(driver.pack(conn, args)) == 1  # hiredis's, one buffer
        conn._command_packer = PythonRespSerializer(conn._buffer_cutoff, conn.encoder.encode)
        assert driver.pack(conn, args) == conn.pack_command(*args)
