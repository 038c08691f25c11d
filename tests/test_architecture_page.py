"""docs/architecture.md names the one place each concern lives: every file it names must exist, so the page
cannot go on describing a module that moved or was removed (tests/test_layout.py checks its import rules)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
NAMED = re.compile(r"`([A-Za-z0-9_./-]+\.(?:py|md|yaml|yml|json|toml))`")


def named_files(text: str) -> list[tuple[str, Path | None]]:
    """(name as written, the file it means) for every backticked file name. In a table row a bare name is in
    that row's package; elsewhere a name with a directory is taken from the repository root or loadgen/, and
    a bare name must be unique across loadgen/ and local_target/ (None: it is not)."""
    out: list[tuple[str, Path | None]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")] if line.startswith("|") else []
        package = re.fullmatch(r"`(loadgen/[a-z_]+/)`", cells[2]) if len(cells) > 3 else None
        for name in NAMED.findall(line):
            if "/" not in name and package:
                out.append((name, ROOT / package.group(1) / name))
            elif "/" in name:
                out.append((name, next((p for p in (ROOT / name, ROOT / "loadgen" / name) if p.exists()), None)))
            else:
                found = [p for d in ("loadgen", "local_target") for p in (ROOT / d).rglob(name)]
                out.append((name, found[0] if len(found) == 1 else None))
    return out


def test_the_reader_resolves_names_by_row_and_by_path(tmp_path: Path) -> None:
    page = ("| core | `loadgen/core/` | parses (`sse.py`, `nowhere.py`) | stdlib |\n"
            "See `run/prepare.py`, `tests/test_layout.py` and `gone/away.py`.\n")
    found = {name: path for name, path in named_files(page)}
    assert found["sse.py"] == ROOT / "loadgen/core/sse.py" and found["sse.py"].exists()
    assert not found["nowhere.py"].exists()  # type: ignore[union-attr]
    assert found["run/prepare.py"] == ROOT / "loadgen/run/prepare.py"
    assert found["tests/test_layout.py"] == ROOT / "tests/test_layout.py"
    assert found["gone/away.py"] is None


def test_every_file_the_architecture_page_names_exists() -> None:
    missing = [name for name, path in named_files(PAGE.read_text()) if path is None or not path.exists()]
    assert missing == []


def test_every_module_of_loadgen_is_on_the_page() -> None:
    """The converse: a module the page does not place has no stated responsibility."""
    placed = {path for _, path in named_files(PAGE.read_text()) if path is not None}
    modules = {p for p in (ROOT / "loadgen").rglob("*.py") if p.name != "__init__.py"}
    assert sorted(str(p.relative_to(ROOT)) for p in modules - placed) == []
