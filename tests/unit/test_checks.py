"""The checks the contract suite applies to recorded intervals must themselves catch what
they are meant to catch."""

from __future__ import annotations

import pytest

from tests.contract.lock_harness import check_bounded, check_exclusive, max_concurrency


def iv(start: float, end: float, token: int, asked: float | None = None) -> dict[str, float]:
    return {"start": start, "end": end, "token": token, "asked": start if asked is None else asked}


def test_max_concurrency() -> None:
    assert max_concurrency([]) == 0
    assert max_concurrency([iv(0, 1, 1), iv(1, 2, 2)]) == 1  # touching is not overlapping
    assert max_concurrency([iv(0, 2, 1), iv(1, 3, 2), iv(1.5, 1.6, 3)]) == 3
    assert max_concurrency([iv(0, 1, 1), iv(2, 3, 2), iv(2.5, 4, 3)]) == 2


def test_check_exclusive_accepts_sequential_sections() -> None:
    check_exclusive([iv(2, 3, 20), iv(0, 1, 5), iv(1, 2, 10)])


def test_check_exclusive_catches_overlap() -> None:
    with pytest.raises(AssertionError, match="overlap"):
        check_exclusive([iv(0, 1.01, 1), iv(1, 2, 2)])


def test_check_exclusive_catches_token_going_backwards() -> None:
    with pytest.raises(AssertionError, match="token"):
        check_exclusive([iv(0, 1, 5), iv(1, 2, 5)])
    with pytest.raises(AssertionError, match="token"):
        check_exclusive([iv(0, 1, 5), iv(1, 2, 4)])


def test_check_bounded() -> None:
    ok = [iv(0, 2, 1), iv(0.5, 1, 2, asked=0), iv(1, 3, 3, asked=0.6), iv(2, 3, 4, asked=0.7)]
    assert check_bounded(ok, 2) == 2
    with pytest.raises(AssertionError, match="3 holders at once"):
        check_bounded([*ok, iv(2.5, 2.6, 5)], 2)
    with pytest.raises(AssertionError, match="twice"):
        check_bounded([iv(0, 1, 1), iv(2, 3, 1)], 2)
    with pytest.raises(AssertionError, match="asked for after"):
        check_bounded([iv(0, 1, 9), iv(2, 3, 3)], 2)
