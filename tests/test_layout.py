"""The architecture (docs/architecture.md), checked from the source: which stage may import which, which
libraries each stage may use, and the size limits (modules ≤ 400 lines, drivers ≤ 250, functions ≤ 60)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "loadgen"
# stage → the loadgen stages it may import (data flows one way: plan → drivers → core → records → analysis →
# report; run orchestrates them, the api and the CLI sit on top; errors.py, stdlib only, is everyone's)
MAY_IMPORT = {
    "errors": {"errors"},
    "core": {"errors", "core"},
    "records": {"errors", "core", "records"},
    "plan": {"errors", "core", "plan"},
    "drivers": {"errors", "core", "plan", "drivers"},
    "analysis": {"errors", "core", "records", "plan", "analysis"},
    "report": {"errors", "core", "records", "plan", "analysis", "report"},
    "advise": {"errors", "core", "records", "plan", "analysis", "report", "advise"},
    "run": {"errors", "core", "records", "plan", "drivers", "analysis", "report", "advise", "run"},
    "shrink": {"errors", "core", "records", "plan", "drivers", "analysis", "report", "advise", "run", "shrink"},
    "api": {"errors", "core", "records", "plan", "drivers", "analysis", "report", "advise", "run", "shrink", "api"},
    "cli": {"errors", "core", "records", "plan", "drivers", "analysis", "report", "advise", "run", "shrink", "api",
            "cli"},
}
NETWORK = {"httpx", "httpcore", "h11", "httptools", "uvloop", "locust", "gevent", "geventhttpclient", "flask"}
LOCUST = {"locust", "gevent", "geventhttpclient", "flask"}


def stage_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code (function-level imports too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


MODULES = sorted(p for p in PKG.rglob("*.py") if stage_of(p) not in ("__init__", "__main__"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_stage_imports_only_the_stages_before_it(path: Path) -> None:
    stage = stage_of(path)
    used = {m.split(".")[1] for m in imports_of(path) if m.startswith("loadgen.") and m.count(".") >= 1}
    used.discard("__version__")
    assert used <= MAY_IMPORT[stage], f"{stage} imports {sorted(used - MAY_IMPORT[stage])}"
    tops = {m.split(".")[0] for m in imports_of(path)}
    if stage in ("core", "plan", "records", "analysis", "report"):
        assert not tops & (NETWORK | {"local_target"}), f"{stage} imports {sorted(tops & (NETWORK | {'local_target'}))}"
    if stage in ("core", "errors"):
        import sys
        assert tops - {"loadgen"} <= set(sys.stdlib_module_names), tops - set(sys.stdlib_module_names)
    if tops & LOCUST:
        assert path == PKG / "drivers" / "locust_user.py" or (tops & LOCUST) == {"flask"} and \
            path == PKG / "run" / "locust_ui.py", f"{path.name} imports {tops & LOCUST}"


def test_local_target_never_imports_loadgen() -> None:
    offenders = [p for p in (ROOT / "local_target").rglob("*.py")
                 if any(m == "loadgen" or m.startswith("loadgen.") for m in imports_of(p))]
    assert offenders == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_fit_their_limits(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= (250 if stage_of(path) == "drivers" else 400), f"{lines} lines"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= 60, f"{node.name}: {length} lines"
