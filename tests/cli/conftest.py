from __future__ import annotations

import secrets
from pathlib import Path

import pytest


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store of this test's own (deleted with tmp_path)."""
    return f"sqlite:///{tmp_path}/cli-{secrets.token_hex(4)}.db"
