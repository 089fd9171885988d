"""Fixtures for the tests that run against moto, a local emulator of the AWS APIs (not AWS)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from tests.aws._moto import MotoServer, missing


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """One moto server (a local emulator of AWS, not AWS) for the session, with its
    Step Functions interpreter of real ASL on. Skips only if moto is not installed."""
    if importlib.util.find_spec("moto") is None:
        missing(
            "moto is not installed: these tests run against moto, a local emulator of the "
            "AWS APIs (pip install 'moto[server,stepfunctions,sqs]' boto3)"
        )
    with MotoServer() as server:
        yield server


@pytest.fixture
def moto(moto_server: MotoServer) -> MotoServer:
    """The session's moto server, emptied of every queue, state machine and execution."""
    moto_server.reset()
    return moto_server
