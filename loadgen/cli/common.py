"""What every command of the ``loadgen`` command line shares: the consoles, the one way to fail on bad input
(one line, exit 2, before anything is sent), the flags that override scenario fields, and loading a scenario."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from loadgen.plan.scenario import Scenario

console = Console()
err = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(code)


FLAGS = {"target.base_url": "--base-url", "target.model": "--model", "target.api_key_env": "--api-key-env",
         "load.duration_s": "--duration", "target.request_timeout_s": "--request-timeout",
         "load.drain_timeout_s": "--drain-timeout"}


def scenario_overrides(sets: list[str], base_url: str | None = None, model: str | None = None,
               api_key_env: str | None = None, seconds: dict[str, float | None] | None = None) -> list[str]:
    """--set items, then the dedicated flags as overrides of their fields (``seconds``: field → value)."""
    items = list(sets)
    for key, value in (("target.base_url", base_url), ("target.model", model), ("target.api_key_env", api_key_env)):
        if value is not None:
            items.append(f"{key}={json.dumps(value)}")
    for field, value in (seconds or {}).items():
        if value is None:
            continue
        if not (math.isfinite(value) and value > 0 or field == "load.drain_timeout_s" and value == 0):
            raise fail(f"{FLAGS[field]} {value}: give a finite number of seconds above 0")
        items.append(f"{field}={json.dumps(value)}")
    return items


def load(path: Path, overrides: list[str]) -> Scenario:
    """The scenario, its secrets registered with the redactor before anything else can print them."""
    from loadgen import api  # here: `loadgen target` starts a server without loading the load generator

    return api.load_scenario(path, overrides, FLAGS)


def check_out_dir(out: Path) -> None:
    """--out must be a directory we can write that holds no run yet (exit 2 before anything is sent)."""
    if out.exists() and not out.is_dir():
        raise fail(f"--out {out}: not a directory")
    if any(out.glob("requests*.parquet")):
        raise fail(f"--out {out} already holds a run's records (requests.parquet): give a new directory, or "
                    "remove that one; runs are never mixed")
    existed = out.exists()
    try:  # a real write (root passes every permission check but not a read-only or full file system)
        out.mkdir(parents=True, exist_ok=True)
        (out / ".loadgen-write-test").write_bytes(b"")
        (out / ".loadgen-write-test").unlink()
    except OSError as exc:
        raise fail(f"--out {out}: cannot write there: {exc.strerror or exc}") from None
    finally:
        if not existed and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
