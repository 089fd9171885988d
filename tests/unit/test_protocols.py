"""Capabilities are declared, not discovered: every backend class has every member of its
protocol (``_async/backends/protocol.py`` and its generated twin) with the same signature,
declares its characteristics in one place, and nothing in ``src/`` probes a backend or a
waiter with getattr/hasattr."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from turnstile import Characteristics, NotSupported
from turnstile._sync.backends.memory import MemoryBackend

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "turnstile"
STORES = ("memory", "sqlite", "redis", "postgres", "http")
FLAVOURS = {"async": "Async", "sync": ""}
# Class names per store (without the flavour's prefix); http has no queue waiter, as its
# blocking gets are long polls on the service.
CLASS_NAMES = {
    "memory": ("MemoryBackend", "MemoryWaiter", "MemoryQueueBackend", "MemoryQueueWaiter"),
    "sqlite": ("SQLiteBackend", "SQLiteWaiter", "SQLiteQueueBackend", "SQLiteQueueWaiter"),
    "redis": ("RedisBackend", "RedisWaiter", "RedisQueueBackend", "RedisQueueWaiter"),
    "postgres": (
        "PostgresBackend",
        "PostgresWaiter",
        "PostgresQueueBackend",
        "PostgresQueueWaiter",
    ),
    "http": ("HTTPBackend", "HTTPWaiter", "HTTPQueueBackend", None),
}
PROTOCOLS = ("Backend", "Waiter", "QueueBackend", "QueueWaiter")
QUEUE_MODULE = {"memory": "memory_queue", "sqlite": "sqlite_queue", "redis": "redis_queue"}
QUEUE_MODULE |= {"postgres": "postgres_queue", "http": "http"}
# What a backend may learn about its store after the declaration (from its URL, the server
# it reaches, or the service's /v1/info); the capability fields are never among them.
FACTS = {"scheme", "durable", "woken_by_store", "description"}
CAPABILITIES = {
    "cheap_waiters",
    "keeps_early_wakeups",
    "queues",
    "long_poll_gets",
    "local_deliveries",
}


def _package(flavour: str) -> str:
    return f"turnstile._{flavour}.backends"


def _module(flavour: str, name: str) -> ModuleType:
    return importlib.import_module(f"{_package(flavour)}.{name}")


def _classes() -> list[tuple[str, type[Any], type[Any]]]:
    """(label, backend class, protocol class) for every store, flavour and protocol."""
    found = []
    for flavour, prefix in FLAVOURS.items():
        protocol = _module(flavour, "protocol")
        for store in STORES:
            for index, short in enumerate(CLASS_NAMES[store]):
                if short is None:
                    continue
                module = _module(flavour, store if index < 2 else QUEUE_MODULE[store])
                cls = module.__dict__[prefix + short]
                proto = protocol.__dict__[prefix + PROTOCOLS[index]]
                found.append((f"{flavour}-{prefix}{short}", cls, proto))
    return found


def _members(proto: type[Any]) -> tuple[dict[str, Any], set[str]]:
    """The protocol's methods (name -> function) and data members (names)."""
    methods = {
        name: value
        for name, value in vars(proto).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }
    return methods, set(vars(proto).get("__annotations__", {}))


def _params(fn: Any) -> list[tuple[str, Any, Any, Any]]:
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in inspect.signature(fn).parameters.values()
    ]


def _assigns_self(cls: type[Any], attribute: str) -> bool:
    tree = ast.parse(inspect.getsource(cls).strip())
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == attribute
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and isinstance(node.ctx, ast.Store)
        for node in ast.walk(tree)
    )


def conformance_problems(cls: type[Any], proto: type[Any]) -> list[str]:
    """Every way ``cls`` fails ``proto``: a missing member, a method that is async in one and
    not the other, or parameters that differ in name, kind, default or annotation. (The
    return type may be narrower, e.g. the store's own waiter class: mypy checks that.)"""
    problems = []
    methods, data = _members(proto)
    for name, expected in methods.items():
        actual = inspect.getattr_static(cls, name, None)
        if not inspect.isfunction(actual):
            problems.append(f"{name}: missing")
            continue
        if inspect.iscoroutinefunction(actual) != inspect.iscoroutinefunction(expected):
            problems.append(f"{name}: async in one and not the other")
        if _params(actual) != _params(expected):
            problems.append(
                f"{name}: {inspect.signature(actual)} differs from {inspect.signature(expected)}"
            )
    for name in data:
        if inspect.getattr_static(cls, name, None) is None and not _assigns_self(cls, name):
            problems.append(f"{name}: never set")
    return problems


@pytest.mark.parametrize(("label", "cls", "proto"), _classes(), ids=lambda v: str(v))
def test_backend_class_satisfies_its_protocol(label: str, cls: type[Any], proto: type[Any]) -> None:
    assert conformance_problems(cls, proto) == [], label
    methods, _ = _members(proto)
    assert proto.__module__.endswith(".protocol") and methods


def test_every_store_and_flavour_is_checked() -> None:
    labels = [label for label, _, _ in _classes()]
    assert len(labels) == 2 * (4 * len(STORES) - 1)  # http has no queue waiter


def test_conformance_check_catches_a_missing_or_changed_method() -> None:
    from turnstile._sync.backends.protocol import Backend, QueueWaiter

    class NoPing(MemoryBackend):
        ping = None  # type: ignore[assignment]

    class OtherRelease(MemoryBackend):
        def release(self, name: str, holder: str, token: int) -> bool:  # type: ignore[override]
            return False

    class AsyncStatus(MemoryBackend):
        async def status(self, name: str) -> Any:  # type: ignore[override]
            return None

    class Waiter:
        id = "w"

        def wait(self, timeout: float) -> bool:
            return False

        def close(self, registered: bool = False) -> None:
            return None

    assert conformance_problems(MemoryBackend, Backend) == []
    assert conformance_problems(NoPing, Backend) == ["ping: missing"]
    assert [p.split(":")[0] for p in conformance_problems(OtherRelease, Backend)] == ["release"]
    assert conformance_problems(AsyncStatus, Backend) == ["status: async in one and not the other"]
    assert [p.split(":")[0] for p in conformance_problems(Waiter, QueueWaiter)] == ["close"]


def test_runtime_checkable_protocols_accept_the_memory_store() -> None:
    from turnstile._sync.backends import protocol

    backend = MemoryBackend()
    assert isinstance(backend, protocol.Backend)
    assert isinstance(backend.queues(), protocol.QueueBackend)
    assert isinstance(backend.open_waiter("n", "h"), protocol.Waiter)
    assert isinstance(backend.queues().open_waiter("q"), protocol.QueueWaiter)


# -- characteristics: declared once -------------------------------------------------------
def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
    ]


def _source_files() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "_sync" not in p.relative_to(SRC).parts)


def test_characteristics_are_built_once_per_backend_module_as_its_constant() -> None:
    built: dict[str, int] = {}
    for path in _source_files():
        tree = ast.parse(path.read_text("utf-8"))
        calls = _calls(tree, "Characteristics")
        if not calls:
            continue
        built[path.relative_to(SRC).as_posix()] = len(calls)
        declared = [
            node
            for node in tree.body
            if isinstance(node, ast.Assign)
            and [ast.unparse(t) for t in node.targets] == ["CHARACTERISTICS"]
            and isinstance(node.value, ast.Call)
            and node.value in calls
        ]
        assert len(declared) == 1, f"{path}: Characteristics(...) outside CHARACTERISTICS"
    assert built == {f"_async/backends/{store}.py": 1 for store in STORES}


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("store", STORES)
def test_each_backend_class_carries_its_module_constant(flavour: str, store: str) -> None:
    module = _module(flavour, store)
    cls = module.__dict__[FLAVOURS[flavour] + CLASS_NAMES[store][0]]
    declared = vars(cls)["characteristics"]
    assert declared is module.__dict__["CHARACTERISTICS"]
    assert isinstance(declared, Characteristics)


def test_refinements_after_the_declaration_only_learn_facts() -> None:
    """A backend may replace its characteristics once it knows its store (Redis: AOF and
    version; HTTP: the service's store), but only fact fields, and only from the declaration."""
    seen = 0
    for path in _source_files():
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                ast.unparse(t).endswith(".characteristics") for t in node.targets
            ):
                value = node.value
                assert isinstance(value, ast.Call) and ast.unparse(value.func) in (
                    "dataclasses.replace",
                    "replace",
                ), f"{path}:{node.lineno}: characteristics set other than by replace()"
                base = ast.unparse(value.args[0])
                assert base in ("CHARACTERISTICS", "self.characteristics"), (path, base)
                fields = {k.arg for k in value.keywords}
                assert fields <= FACTS, f"{path}:{node.lineno}: {fields - FACTS}"
                seen += 1
    # redis and http: at construction and once connected; postgres with durability=relaxed
    assert seen == 5


def test_capabilities_as_declared() -> None:
    table = {}
    for store in STORES:
        chars = _module("async", store).__dict__["CHARACTERISTICS"]
        table[store] = {f for f in CAPABILITIES if getattr(chars, f)}
    assert table == {
        "memory": {"queues", "local_deliveries"},
        "sqlite": {"queues", "local_deliveries"},
        "redis": {"queues", "keeps_early_wakeups", "local_deliveries"},
        "postgres": {"queues", "keeps_early_wakeups", "local_deliveries"},
        "http": {"queues", "long_poll_gets"},
    }
    assert CAPABILITIES | FACTS | {"cross_process", "cross_host"} == {
        f.name for f in dataclasses.fields(Characteristics)
    }


def test_the_documented_defaults_of_a_store_without_the_behaviour() -> None:
    backend = MemoryBackend()
    waiter = backend.open_waiter("n", "h")
    assert waiter.handed(1) is None
    with pytest.raises(NotSupported):
        backend.queues().long_poll(
            "q", wait=1.0, visibility_timeout=30.0, concurrency=None, max_attempts=5
        )
    waiter.close()
    backend.close()


# -- nothing discovered by duck typing ----------------------------------------------------
def test_no_getattr_or_hasattr_on_a_backend_or_waiter_in_src() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text("utf-8")
        for call in _calls(ast.parse(text), "getattr") + _calls(ast.parse(text), "hasattr"):
            if not isinstance(call.func, ast.Name) or not call.args:
                continue
            subject = (ast.get_source_segment(text, call.args[0]) or "").lower()
            if "backend" in subject or "waiter" in subject:
                found.append(f"{path.relative_to(SRC)}:{call.lineno}: {ast.unparse(call)}")
    assert found == []
