"""No import cycles among the modules of ``src/turnstile``.

The graph is built from the source (AST), not by importing: one node per module, one edge per
import that runs when the module is imported, with relative imports resolved. Counted: every
``import``/``from ... import`` at module level, also inside module-level ``if``/``try``/
``with`` blocks and class bodies (they run at import time too). Not counted: imports under
``if TYPE_CHECKING:`` (they never run) and imports inside functions (they run only when
called, after every module has loaded). ``from package import name`` is an edge to the
submodule ``package.name`` when there is one, else to ``package``; the implicit import of a
module's parent packages is not an edge (Python finishes a parent before its children can
look at it half-made only through the names the parent itself imports, which are edges).
"""

from __future__ import annotations

import ast
from pathlib import Path

import turnstile

ROOT = Path(turnstile.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += _import_time_statements(node.body)
            found += _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                found += _import_time_statements(block)
            for handler in node.handlers:
                found += _import_time_statements(handler.body)
        elif isinstance(node, ast.With | ast.ClassDef):
            found += _import_time_statements(node.body)
    return found


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _import_time_statements(ast.parse(path.read_text("utf-8")).body):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        if node.level:
            base_parts = package.split(".")
            base_parts = base_parts[: len(base_parts) - (node.level - 1)]
            base = ".".join(base_parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            targets.add(submodule if submodule in modules else base)
    return {target for target in targets if target in modules and target != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _edges(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path that starts and ends at the same module, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found is not None:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found is not None:
                return found
    return None


def test_the_graph_sees_the_modules_and_their_imports() -> None:
    graph = import_graph()
    assert "turnstile._async.backends.redis" in graph
    # A relative import resolves to the submodule it names.
    assert "turnstile._async.backends.redis_connection" in graph["turnstile._async.backends.redis"]
    assert "turnstile._async._compat" in graph["turnstile._async.backends.redis_connection"]
    # Imports under TYPE_CHECKING are not edges.
    assert "turnstile._async.backends.redis_queue" not in graph["turnstile._async.backends.redis"]


def test_find_cycle_names_the_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles_in_src() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_lock_and_queue_backends_do_not_import_each_other() -> None:
    graph = import_graph()
    for flavour in ("_async", "_sync"):
        for store in ("redis", "postgres"):
            lock = f"turnstile.{flavour}.backends.{store}"
            queue = f"turnstile.{flavour}.backends.{store}_queue"
            assert queue not in graph[lock]
            assert lock not in graph[queue]
