"""The structure the architecture page (docs/architecture.md) promises, checked from the source: no import circle
anywhere in loadgen/ (every import counts: top-level, inside a function, or under TYPE_CHECKING), and no module
reaching into another module's underscored members."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "loadgen"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def imported_modules(name: str, path: Path) -> set[str]:
    """The loadgen modules ``path`` imports: ``from pkg import sub`` is the submodule, ``from mod import x`` the
    module; relative imports resolved; ``importlib.import_module("...")`` with a literal counts too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args \
                and isinstance(node.args[0], ast.Constant):
            found.add(str(node.args[0].value))
    return {m for m in found if m in MODULES and m != name}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_loadgen() -> None:
    edges = {name: imported_modules(name, path) for name, path in MODULES.items()}
    # a package imports what its __init__ re-exports; that is not a circle of modules
    for name in edges:
        edges[name] = {m for m in edges[name] if not name.startswith(m + ".")}
    assert cycles(edges) == []


def own_private_names(tree: ast.AST) -> set[str]:
    """Underscored names this module defines: attributes it assigns (``x._a = …``, ``self._a: T``), class-body
    names and functions."""
    names: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute):
                    names.add(t.attr)
                elif isinstance(t, ast.Name):
                    names.add(t.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_reaches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    own = own_private_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("loadgen"):
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls") or node.attr in own:
                continue
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "super":
                continue  # a subclass extending its base's hook
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_private_access_finder_finds_one(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from loadgen.x import _helper\nclass A:\n    def __init__(self):\n        self._mine = 1\n"
                      "def f(engine, a: A):\n    return engine._spawn(), a._mine, super()._hook()\n")
    assert private_reaches(module) == ["1: from loadgen.x import _helper", "6: engine._spawn"]


def test_no_module_touches_another_modules_private_members() -> None:
    found = {str(p.relative_to(ROOT)): private_reaches(p) for p in sorted(PKG.rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}
