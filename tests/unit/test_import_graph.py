"""The import graph of the library and the reference app has no circle: every import counts,
at module level, inside a function (which hides a circle, it does not cut it) or under
``TYPE_CHECKING`` (pure: the files are read, not imported)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs_platform", "tasks")


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {
        module_of(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts  # Alembic loads these by path
    }


def imported(path: Path, module: str, known: set[str]) -> Iterator[str]:
    """The project modules ``path`` imports, anywhere in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports the submodule when there is one, else pkg.
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [name if name in known else base for name in names]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b.c`: the deepest project module
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {module: set(imported(path, module, known)) for module, path in found.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def test_the_import_graph_has_no_circle() -> None:
    edges = graph()
    assert len(edges) > 100  # the walk found the tree
    found = circles(edges)
    assert not found, "import circles (modules that import each other, directly or not):\n" + (
        "\n".join(" <-> ".join(circle) for circle in found)
    )


def test_the_checker_sees_a_circle_closed_inside_a_function() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]
    source = "def f():\n    from jobs_platform import task\n"
    tree = ast.parse(source)
    assert any(isinstance(node, ast.ImportFrom) for node in ast.walk(tree))
