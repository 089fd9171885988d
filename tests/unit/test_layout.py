"""The layout reads at a glance: no two modules told apart by one letter, and no two
packages of the library sharing a name (the generated ``_sync`` twin of ``_async`` aside).

Names that differ by one letter (``model``/``models``, ``queue``/``queues``) make a reader
look twice; two folders with one name (two ``backends``) make them ask which one is meant.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("src", "tests", "benchmarks", "scripts")


def _one_edit_apart(a: str, b: str) -> bool:
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def _modules() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for tree in TREES:
        for path in (ROOT / tree).rglob("*.py"):
            if "_sync" in path.parts or ".venv" in path.parts:
                continue
            found[path.stem].append(str(path.relative_to(ROOT)))
    return found


def test_no_two_modules_are_told_apart_by_one_letter() -> None:
    modules = _modules()
    names = sorted(modules)
    close = [
        (modules[a], modules[b])
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if _one_edit_apart(a, b)
    ]
    assert not close, f"modules told apart by one letter: {close}"


def test_no_two_packages_of_the_library_share_a_name() -> None:
    src = ROOT / "src" / "turnstile"
    packages: dict[str, list[str]] = defaultdict(list)
    for init in src.rglob("__init__.py"):
        folder = init.parent
        if "_sync" in folder.relative_to(src).parts:
            continue  # the generated twin of _async, by design
        packages[folder.name].append(str(folder.relative_to(ROOT)))
    shared = {name: where for name, where in packages.items() if len(where) > 1}
    assert not shared, f"packages sharing a name: {shared}"


def test_the_check_catches_what_it_is_for() -> None:
    assert _one_edit_apart("model", "models")
    assert _one_edit_apart("queue", "queues")
    assert _one_edit_apart("scenario", "scenarios")
    assert not _one_edit_apart("lock_machine", "queue_machine")
    assert not _one_edit_apart("records", "records")
