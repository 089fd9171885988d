"""Argument validation: each check accepts its range and refuses everything else with an
InvalidArgument that names the argument and the accepted range."""

from __future__ import annotations

import math
from typing import Any

import pytest

from turnstile._core import validate
from turnstile.errors import InvalidArgument, TurnstileError


def refused(fn: Any, value: Any, *words: str) -> str:
    with pytest.raises(InvalidArgument) as info:
        fn(value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TurnstileError)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"
    return str(info.value)


@pytest.mark.parametrize(
    "value", ["a", "x" * 4096, "😀" * 1024, "{a}", " ", "'; DROP TABLE x; --", "\n", "*"]
)
def test_name_accepts(value: str) -> None:
    assert validate.name(value) == value


def test_name_refuses() -> None:
    refused(validate.name, "", "name", "empty", "4096")
    refused(validate.name, "x" * 4097, "name", "4097 bytes", "1 to 4096")
    refused(validate.name, "é" * 2049, "name", "4098 bytes")
    refused(validate.name, "😀" * 1024 + "x", "name", "4097 bytes")
    refused(validate.name, "a\x00", "name", "NUL")
    refused(validate.name, "\udcff", "name", "Unicode")
    for bad in (None, 1, b"x", ["x"]):
        refused(validate.name, bad, "name", "string")
    refused(lambda v: validate.name(v, "queue"), "", "queue")


def test_holder() -> None:
    assert validate.holder("h" * 1024) == "h" * 1024
    refused(validate.holder, "", "holder", "1 to 1024")
    refused(validate.holder, "h" * 1025, "holder", "1025 bytes")
    refused(validate.holder, "a\x00", "holder", "NUL")
    refused(validate.holder, 3, "holder", "string")


@pytest.mark.parametrize("value", [0.05, 1, 2.5, 30 * 24 * 3600])
def test_ttl_accepts(value: float) -> None:
    assert validate.ttl(value) == float(value)
    assert isinstance(validate.ttl(value), float)


@pytest.mark.parametrize(
    "value", [0, -1, 0.049, math.nan, math.inf, -math.inf, 30 * 24 * 3600 + 1, 1e300]
)
def test_ttl_refuses_out_of_range(value: float) -> None:
    refused(validate.ttl, value, "ttl")


@pytest.mark.parametrize("value", [True, False, None, "1", [1], 1j])
def test_ttl_refuses_non_numbers(value: Any) -> None:
    refused(validate.ttl, value, "ttl", "number")


def test_ttl_message_names_range() -> None:
    message = refused(validate.ttl, 0, "ttl")
    assert "0.05" in message and "30 days" in message
    refused(lambda v: validate.ttl(v, "wait_ttl"), -1, "wait_ttl")


def test_timeout() -> None:
    assert validate.timeout(None) is None
    assert validate.timeout(0) == 0.0
    assert validate.timeout(2) == 2.0
    refused(validate.timeout, -0.1, "timeout", "None or between 0")
    refused(validate.timeout, math.inf, "timeout", "finite", "None")
    refused(validate.timeout, -math.inf, "timeout")
    refused(validate.timeout, math.nan, "timeout", "NaN")
    refused(validate.timeout, 1e12, "timeout")
    refused(validate.timeout, True, "timeout")
    refused(validate.timeout, "3", "timeout")


def test_seconds() -> None:
    assert validate.seconds(1, "delay", low=0, high=2) == 1.0
    refused(lambda v: validate.seconds(v, "delay", low=0, high=2), 3, "delay", "between 0 and 2")


def test_limit() -> None:
    assert validate.limit(1) == 1
    assert validate.limit(1_000_000) == 1_000_000
    for bad in (0, -1, 1_000_001, 10**30):
        refused(validate.limit, bad, "limit", "between 1 and 1000000")
    for bad in (True, 1.0, 2.5, "2", None):
        refused(validate.limit, bad, "limit", "integer")


def test_token() -> None:
    assert validate.token(None) is None
    assert validate.token(1) == 1
    assert validate.token(2**63 - 1) == 2**63 - 1
    for bad in (0, -5, 2**63):
        refused(validate.token, bad, "token", "between 1 and 2**63-1")
    for bad in (True, 1.0, "1"):
        refused(validate.token, bad, "token", "integer")
