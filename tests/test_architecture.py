"""The layout's rules, read from the source (docs/architecture.md): the network imports no kernel and no
loop, the caches record and check, and no import circle ties the package together.

Imports are read with ``ast`` (lazy ones inside functions count; those under ``TYPE_CHECKING`` do not:
they are never executed). A module's import of ``whisperkv.a.b`` is an edge to ``whisperkv.a.b``; the
package ``__init__`` files Python runs on the way are not edges (every module would otherwise depend on
``whisperkv/__init__.py``, which imports the front of the package)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "whisperkv"

#: (importer's prefix, imported prefix, why not)
FORBIDDEN = (
    ("whisperkv.model", "whisperkv.cpu", "the network imports no kernel: the backend is chosen at load"),
    ("whisperkv.model", "whisperkv.decoding", "the network never imports the search"),
    ("whisperkv.model", "whisperkv.engine", "the network never imports the loop"),
    ("whisperkv.model", "whisperkv.transcribe", "the network never imports the loop"),
    ("whisperkv.model", "whisperkv.load", "load builds the network, not the other way"),
    ("whisperkv.cache", "whisperkv.model", "caches record and check; they never run the network"),
    ("whisperkv.cache", "whisperkv.cpu", "caches import no kernel"),
    ("whisperkv.cache", "whisperkv.local_encoder", "the store is given its encoder"),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    return skipped


def _imported(module: str, path: Path, node: ast.AST, modules: dict[str, Path]) -> list[str]:
    """The dotted names an import statement brings in: ``from a import b`` is ``a.b`` where that is a
    module, else ``a`` (a name defined in it)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports (the longest name that is a module; a module's own
    parent packages are not edges)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_nodes(tree)
        targets = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            for name in _imported(module, path, node, modules):
                target = resolve(name)
                if target and target != module and not module.startswith(target + "."):
                    targets.add(target)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_checks_see_a_circle_and_a_forbidden_import():
    """The checks themselves: a made-up graph with a circle and a model → cpu edge is caught."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "whisperkv.model.x": {"whisperkv.cpu.y"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    broken = [(m, t) for m, ts in graph.items() for t in ts if _under(m, "whisperkv.model")]
    assert broken == [("whisperkv.model.x", "whisperkv.cpu.y")] and _under("whisperkv.cpu.y", "whisperkv.cpu")
    assert not _under("whisperkv.cpux", "whisperkv.cpu")


def test_the_graph_reads_real_imports():
    """Known edges are seen (a lazy import inside a function included), TYPE_CHECKING ones are not."""
    graph = import_graph()
    assert "whisperkv.cpu.plan" in graph["whisperkv.load"]
    assert "whisperkv.model.attention" in graph["whisperkv.cpu.plan"]
    assert "whisperkv.model.whisper" not in graph["whisperkv.cache.store"]  # under TYPE_CHECKING there


def test_no_import_circle_in_the_package():
    assert circles(import_graph()) == []


@pytest.mark.parametrize("importer, imported, why", FORBIDDEN)
def test_no_forbidden_direction(importer: str, imported: str, why: str):
    graph = import_graph()
    broken = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if _under(module, importer)
        for target in targets
        if _under(target, imported)
    )
    assert broken == [], why
