"""scripts/dev.py test: how many pytest-xdist workers it asks for, and when it leaves it to
the caller."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def dev() -> ModuleType:
    if str(SCRIPTS) not in sys.path:  # dev.py imports its sibling servers.py by that name
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("turnstile_dev_script", SCRIPTS / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_default_is_parallel_in_groups(dev: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTILE_TEST_WORKERS", raising=False)
    workers = str(dev.DEFAULT_TEST_WORKERS)
    assert dev.parallel_args([]) == ["-n", workers, "--dist", "loadgroup"]
    assert dev.parallel_args(["tests/contract", "-k", "redis"]) == [
        "-n", workers, "--dist", "loadgroup"
    ]


def test_environment_chooses_the_number(dev: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNSTILE_TEST_WORKERS", "3")
    assert dev.parallel_args([]) == ["-n", "3", "--dist", "loadgroup"]
    monkeypatch.setenv("TURNSTILE_TEST_WORKERS", "1")
    assert dev.parallel_args([]) == []  # one process, without xdist
    for bad in ("0", "-2", "many", "2.5"):
        monkeypatch.setenv("TURNSTILE_TEST_WORKERS", bad)
        with pytest.raises(dev.StepFailed, match="TURNSTILE_TEST_WORKERS"):
            dev.parallel_args([])


@pytest.mark.parametrize(
    "args",
    [["-n", "2"], ["-n2"], ["--numprocesses=auto"], ["--numprocesses", "2"], ["-p", "no:xdist"],
     ["-pno:xdist"]],
)
def test_callers_choice_wins(
    dev: ModuleType, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.setenv("TURNSTILE_TEST_WORKERS", "3")
    assert dev.parallel_args(args) == []
