"""The lock scripts as a Redis function library (stores/redis/scripts.py): built from the same
files as the scripts, and every step starting from the state a script starts from. No server:
tests/stores/redis runs both on real ones."""

from __future__ import annotations

import re
from importlib import resources

from turnstile.stores.redis import scripts

LUA = resources.files("turnstile.stores.redis").joinpath("lua", "lock")


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


def test_every_variable_a_step_changes_is_set_afresh_by_begin() -> None:
    # A function library makes the helpers once, so whatever a step leaves in a top-level
    # variable the next step would find: begin() must set every one a step may change, and
    # the rest must be constants (a value at declaration, never assigned again).
    lib = LUA.joinpath("_lib.lua").read_text("utf-8")
    begin = _begin_body(lib)
    assigned_in_begin = set(re.findall(r"^\s+([A-Za-z_][\w, ]*?)\s*=", begin, re.M))
    reset = {n.strip() for group in assigned_in_begin for n in group.split(",")}
    rest = lib.replace(begin, "")
    for name, constant in _top_level_locals(lib).items():
        if constant:
            assert not re.search(rf"^\s+{name}\s*=", rest, re.M), f"{name} is changed"
        else:
            assert name in reset, f"begin() does not set {name}"
    head = LUA.joinpath("_head.lua").read_text("utf-8")
    for name, constant in _top_level_locals(head).items():
        assert constant, name
        changed = re.search(rf"^\s+{name}\s*=", head + lib, re.M)
        # PRELOAD, which a fast path sets, is set afresh by each registered function.
        assert not changed or name == "PRELOAD", f"{name} is changed"
    built = scripts.library("lock")
    assert built is not None
    assert "KEYS, ARGV, PRELOAD = keys, args, false" in built[0].text


def test_the_library_holds_every_lock_operation_under_names_of_its_own() -> None:
    built = scripts.library("lock")
    assert built is not None
    library, functions = built
    assert set(functions) == set(scripts.LOCK_OPERATIONS)
    digest = library.name.removeprefix("turnstile_lock_")
    assert library.text.startswith(f"#!lua name={library.name}\n")
    for op, function in functions.items():
        assert function == f"turnstile_{digest}_{op}"
        assert f"redis.register_function({function!r}," in library.text
    # The same text, the same names; another text (another release), other names.
    again = scripts.library("lock")
    assert again is not None and again[0] == library
    loaded = scripts.load("lock")
    assert all(s.library == library and s.function == functions[op] for op, s in loaded.items())


def test_each_script_runs_begin_after_its_fast_path_and_before_its_step() -> None:
    for op, script in scripts.load("lock").items():
        text = script.text
        begin = text.index("\nbegin()\n")
        assert text.index("local function begin()") < begin, op
        fast = LUA.joinpath(f"_fast_{op}.lua")
        if fast.is_file():
            assert text.index(fast.read_text("utf-8")) < begin, op
        assert text.endswith(LUA.joinpath(f"{op}.lua").read_text("utf-8")), op


def test_queue_and_rate_scripts_stay_scripts() -> None:
    assert scripts.library("queue") is None and scripts.library("rate") is None
    assert all(s.library is None for s in scripts.load("queue").values())


def test_what_an_fcall_error_means() -> None:
    assert scripts.function_missing("Function not found") is True
    assert scripts.function_missing("ERR Function not found") is True
    assert scripts.function_missing("unknown command 'FCALL', with args beginning with:") is False
    assert scripts.function_missing("NOPERM User x has no permissions to run 'fcall'") is False
    assert scripts.function_missing("TURNSTILE name-collision: two names share") is None
