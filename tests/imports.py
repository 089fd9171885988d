"""Which imports a piece of code makes anew: an import of a module not yet in ``sys.modules``
searches ``sys.path`` again every time (Python caches no failed import), so code run per
operation must make none (tests/contract/test_imports.py, tests/unit/test_http_extra.py)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class _Counting:
    """A meta path finder that finds nothing and records what it was asked for: only an
    import of a module not in ``sys.modules`` reaches it."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        self.asked.append(name)
        return None


@contextlib.contextmanager
def imports_made() -> Iterator[list[str]]:
    """The names of the modules imported anew inside the block (filled in as they come)."""
    finder = _Counting()
    sys.meta_path.insert(0, finder)  # type: ignore[arg-type]
    try:
        yield finder.asked
    finally:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]
