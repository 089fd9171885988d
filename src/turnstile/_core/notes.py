"""Notes per (name, holder) that lapse: what a client remembers between the steps of one
holder (both flavours; no I/O)."""

from __future__ import annotations

import contextlib
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class Notes(Generic[T]):
    """Notes per (name, holder) that lapse: each is kept ``keep`` seconds from when it was
    taken (a new note for the same pair replaces it), and the oldest notes are dropped, as
    new ones come, once they have lapsed or while more than ``most`` are kept (``None``: no
    bound but the lapse). Safe from several threads (dict operations are atomic; a
    concurrent eviction may fail and is skipped)."""

    def __init__(self, most: int | None = None) -> None:
        self._notes: dict[tuple[str, str], tuple[T, float]] = {}
        self._most = most

    def put(self, name: str, holder: str, value: T, keep: float) -> None:
        notes = self._notes
        now = time.monotonic()
        notes.pop((name, holder), None)
        notes[(name, holder)] = (value, now + keep)
        most = len(notes) if self._most is None else self._most
        with contextlib.suppress(RuntimeError, KeyError, StopIteration):
            while True:
                oldest = next(iter(notes))
                if len(notes) <= most and notes[oldest][1] > now:
                    break
                del notes[oldest]

    def get(self, name: str, holder: str) -> T | None:
        note = self._notes.get((name, holder))
        return None if note is None else note[0]

    def pop(self, name: str, holder: str) -> T | None:
        if not self._notes:
            return None
        note = self._notes.pop((name, holder), None)
        return None if note is None else note[0]

    def __len__(self) -> int:
        return len(self._notes)
