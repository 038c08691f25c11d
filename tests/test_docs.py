"""The docs a newcomer reads: the README stays short and shows only commands and flags that exist, the generated
pages (docs/cli.md, docs/metrics.md's table) are what their generators print now, every page is in the site's
nav, and the site builds with ``mkdocs build --strict`` (broken links and anchors fail it)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from loadgen.cli.app import app
from loadgen.cli.reference import CLI_REGENERATE, METRICS_REGENERATE, cli_markdown, with_metrics
from loadgen.cli.run import NO_ARGUMENT
from tests.run_helpers import ROOT

DOCS = ROOT / "docs"


def _root() -> Any:
    return typer.main.get_command(app)


def _shown_commands(text: str) -> list[list[str]]:
    """Every ``loadgen …`` command line the text shows, in a code block or a code span, as its words."""
    lines = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines += re.findall(r"`(loadgen [^`]+)`", text)
    shown = []
    for block in lines:
        for line in block.splitlines():
            start = line.find("loadgen ")
            if start >= 0 and (start == 0 or not line[start - 1].isalnum() and line[start - 1] not in "-/"):
                shown.append(shlex.split(line[start:].split("#")[0].split("&&")[0])[1:])
    return shown


def _resolve(root: Any, words: list[str]) -> tuple[Any, list[str]]:
    """The command the words name (groups followed into their subcommands) and the words after it."""
    ctx = root.context_class(root, info_name="loadgen")
    command, rest = root, list(words)
    while hasattr(command, "list_commands") and rest and not rest[0].startswith("-"):
        if rest[0].isupper():  # a placeholder: `loadgen COMMAND -h`
            break
        names = rest[0].split("|")  # `loadgen scenario list|show|copy`: each of them
        missing = [name for name in names if command.get_command(ctx, name) is None]
        if missing:  # the CLI's groups take no arguments of their own
            raise AssertionError(f"`loadgen {' '.join(words)}`: no command {missing[0]!r}")
        if len(names) > 1:
            return command, rest[1:]
        sub = command.get_command(ctx, rest[0])
        ctx = sub.context_class(sub, parent=ctx, info_name=rest[0])
        command, rest = sub, rest[1:]
    return command, rest


def _flags(command: Any) -> set[str]:
    names = {"-h", "--help"}
    for param in command.params:
        names |= set(param.opts) | set(getattr(param, "secondary_opts", []))
    return names


def test_the_readme_is_what_a_newcomer_reads_first() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert text.startswith("# loadgen\n\n```bash\n") and "loadgen run scenarios/long_context.yaml" in \
        text.splitlines()[3], "the README opens with the two commands: the main job and the tests"
    assert "loadgen run --base-url" in text and "--input-len 512 --output-len 128" in text  # the quick start


def test_the_readmes_links_reach_their_pages_and_headings() -> None:
    """The site checks the docs' links (--strict); the README is not on the site, so its links are checked here."""
    for target in re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text()):
        path, _, anchor = target.partition("#")
        if path.startswith("http"):
            continue
        assert (ROOT / path).is_file(), target
        if anchor:
            headings = re.findall(r"^#+ (.*)$", (ROOT / path).read_text(), re.M)
            assert anchor in {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}, target


def test_the_readmes_second_command_is_what_ci_runs() -> None:
    """CI (.ci/run) runs the README's test command: the same install and the same pytest line."""
    second = (ROOT / "README.md").read_text().splitlines()[4]
    ci = (ROOT / ".ci/run").read_text()
    assert "pip install -q -e '.[test]'" in ci and "pip install -e '.[test]'" in second
    assert "python -m pytest -q -n auto --dist loadfile" in second and \
        ".venv/bin/python -m pytest -q -n auto --dist loadfile" in ci


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md")
                                                    if p.name != "cli.md")])
def test_every_command_and_flag_a_page_shows_exists(page: str) -> None:
    """In code blocks and code spans, old flag names included: the pages teach the names --help shows."""
    root = _root()
    for words in _shown_commands((ROOT / page).read_text()):
        command, rest = _resolve(root, words)
        unknown = [w.split("=")[0] for w in rest if w.startswith("-") and w.split("=")[0] not in _flags(command)]
        assert not unknown, f"{page}: `loadgen {' '.join(words)}`: {unknown} not options of this command"


def test_the_readme_shows_its_commands() -> None:
    assert len(_shown_commands((ROOT / "README.md").read_text())) >= 10


def test_the_checks_catch_a_made_up_command_and_flag() -> None:
    root = _root()
    with pytest.raises(AssertionError, match="no command 'frobnicate'"):
        _resolve(root, ["frobnicate", "x.yaml"])
    with pytest.raises(AssertionError, match="no command 'frob'"):
        _resolve(root, ["dataset", "sample|frob"])
    command, rest = _resolve(root, ["report", "reports/x", "--no-such-flag"])
    assert "--no-such-flag" not in _flags(command) and rest == ["reports/x", "--no-such-flag"]
    assert _shown_commands("see `loadgen run X --out d` and\n```bash\nx && loadgen report d  # why\n```") == \
        [["report", "d"], ["run", "X", "--out", "d"]]


def test_the_sites_first_page_opens_with_what_loadgen_run_alone_prints() -> None:
    assert f"```text\n{NO_ARGUMENT.rstrip()}\n```" in (DOCS / "index.md").read_text()


def test_the_cli_reference_is_current() -> None:
    assert (DOCS / "cli.md").read_text() == cli_markdown(_root()), f"docs/cli.md is stale: {CLI_REGENERATE}"


def test_the_metrics_table_is_current() -> None:
    page = (DOCS / "metrics.md").read_text()
    assert page == with_metrics(page), f"docs/metrics.md's table is stale: {METRICS_REGENERATE}"


def test_the_reference_shows_every_visible_option_with_its_help_and_no_hidden_one() -> None:
    demo = typer.Typer(help="Demo tool.")
    sub = typer.Typer(help="Things.")

    @demo.command()
    def go(scenario: Path = typer.Argument(..., help="the file"),
           rate: float = typer.Option(1.0, "--rate", help="requests | second"),
           png: bool = typer.Option(True, "--png/--no-png", help="charts"),
           old: int = typer.Option(0, "--old-name", hidden=True, help="gone")) -> None:
        """Go somewhere."""

    @sub.command("list")
    def list_() -> None:
        """List things."""

    demo.add_typer(sub, name="thing")
    page = cli_markdown(typer.main.get_command(demo), prog="demo")
    assert "## `demo go`" in page and "## `demo thing list`" in page and "List things." in page
    assert "| `SCENARIO` | path |  | the file |" in page and "demo go [OPTIONS] SCENARIO" in page
    assert "| `--rate` | number | `1.0` | requests \\| second |" in page
    assert "| `--png`, `--no-png` |  | `--png` | charts |" in page
    assert "--old-name" not in page and "gone" not in page


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in _nav_pages(v)]
    return [p for item in nav for p in _nav_pages(item)]


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """A safe loader that reads mkdocs.yml's ``!!python/…`` tag (the slugify function) as nothing."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)


def _mkdocs_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)  # noqa: S506
    return config


def test_every_docs_page_is_in_the_sites_nav() -> None:
    """A page left out of the nav is only an INFO line for mkdocs; here it is a failure."""
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    nav = _nav_pages(_mkdocs_config()["nav"])
    assert sorted(set(nav)) == sorted(nav), "a page twice in the nav"
    assert [p for p in pages if p not in nav] == [], "add these pages to mkdocs.yml's nav"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    """Without -q: mkdocs 1.6 with -q counts no warnings, and --strict passes whatever they were."""
    try:
        import material  # type: ignore[import-untyped]  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("mkdocs-material is not installed (pip install -e '.[test]')")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "site" / "cli" / "index.html").is_file()
