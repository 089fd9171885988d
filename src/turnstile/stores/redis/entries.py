"""The Redis backend's memory of its private waiting entries (both flavours; no I/O)."""

from __future__ import annotations

from ..._core.notes import Notes


class Entries:
    """The waiting entries of this client's private holders (a blocking acquire's own,
    which nobody else asks for): (name, holder) -> its member in line. The store does not
    index them under their holder (a hand-over costs one command less), so the client gives
    the entry back in each step of that holder. A note is dropped when its step learns the
    entry is gone (granted, or out of line), or once it has lapsed: twice the entry's
    wait_ttl after its last step, by when the store has dropped it too (never sooner, so no
    count bound: a note dropped early would have the holder join a second time). A step
    whose outcome is unknown (its reply lost, or the caller cancelled) leaves
    :attr:`UNKNOWN` instead: the store then finds the holder's entry by reading the line."""

    UNKNOWN = "?"

    def __init__(self) -> None:
        self._notes: Notes[str] = Notes()

    def get(self, name: str, holder: str) -> str | None:
        return self._notes.get(name, holder)

    def remember(self, name: str, holder: str, entry: str, wait_ttl: float) -> None:
        self._notes.put(name, holder, entry, 2 * wait_ttl)

    def forget(self, name: str, holder: str) -> None:
        self._notes.pop(name, holder)

    def __len__(self) -> int:
        return len(self._notes)
