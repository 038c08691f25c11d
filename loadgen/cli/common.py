"""What every command of the ``loadgen`` command line shares: the consoles, the one way to fail on bad input
(one line, exit 2, before anything is sent), the flags that override scenario fields, and loading a scenario."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

from typing import TYPE_CHECKING, Any, Callable, Literal, Optional

import typer
from rich.console import Console
from rich.markup import escape

from loadgen.cli import vocabulary

if TYPE_CHECKING:
    from loadgen.plan.scenario import Scenario

Legacy = Optional[Literal["percent", "fraction"]]
console = Console()
err = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(code)


class Parser:
    """A flag's parser from cli/vocabulary.py, as typer's ``parser=``: a bad value is one line and exit 2.
    ``kind`` tells the vocabulary test which parser a flag uses."""

    def __init__(self, kind: str, flag: str, parse: Callable[[Any], Any]) -> None:
        self.kind, self.flag, self._parse = kind, flag, parse
        self.__name__ = kind  # typer names the parameter type after it

    def __call__(self, text: Any) -> Any:
        try:
            return self._parse(text)
        except vocabulary.FlagError as exc:
            raise fail(str(exc)) from None


def seconds_option(default: Any, flag: str, help: str, zero_ok: bool = False) -> Any:
    """A time flag: ``20``, ``20s``, ``2m``, ``1h`` (vocabulary.seconds); a default in seconds shows its unit."""
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        default = f"{default:g}s"  # help says [default: 0.5s], not a bare 0.5; the parser reads it back
    return typer.Option(default, flag, help=help, metavar="TIME",
                        parser=Parser("seconds", flag, lambda t: vocabulary.seconds(t, flag, zero_ok)))


def percent_option(default: Any, flag: str, help: str, legacy: Legacy = None,
                   check: tuple[Callable[[float], bool], str] | None = None) -> Any:
    """A share or level written ``N%`` (vocabulary.percent); ``check``: (accepts, rule) on the fraction."""
    def parse(text: Any) -> float:
        value = vocabulary.percent(text, flag, legacy)
        if check is not None and not check[0](value):
            raise vocabulary.FlagError(f"{flag} {text}: {check[1]}")
        return value

    return typer.Option(default, flag, help=help, metavar="PCT", parser=Parser("percent", flag, parse))


def points(fraction: float) -> float:
    """A fraction from percent_option back in percent, for the APIs that take percent (0.07 → 7, not 7.000…1)."""
    return round(fraction * 100, 9)


LEVEL = (lambda x: 0.5 <= x < 1, "give a level from 50% to below 100%, e.g. 95%")


FLAGS = {"target.base_url": "--base-url", "target.model": "--model", "target.api_key_env": "--api-key-env",
         "target.api": "--api",
         "load.duration_s": "--duration", "target.request_timeout_s": "--request-timeout",
         "load.drain_timeout_s": "--drain-timeout", "load.rate_per_s": "--rate", "load.concurrency": "--concurrency",
         "workload.classes.0.prompt_tokens": "--prompt-tokens", "workload.classes.0.output_tokens": "--output-tokens"}


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
    try:
        entries = sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.is_dir() else []
    except OSError as exc:
        raise fail(f"--out {out}: cannot read it: {exc.strerror or exc}") from None
    if entries:  # a folder of the user's: a run writes summary.json, report.html, … there, over same-named files
        ran = next((n for n in ("run.json", "sweep.json", "repeat.json", "shrink.json") if n in entries), None)
        what = (f"an earlier loadgen run ({ran})" if ran else "files that are not a loadgen run ("
                f"{', '.join(entries[:3])}{', …' if len(entries) > 3 else ''})")
        free = next(out / f"run-{n}" for n in range(1, 10**6) if not (out / f"run-{n}").exists())
        raise fail(f"--out {out} holds {what}: give a new or empty directory, e.g. --out {shlex.quote(str(free))}; "
                   "loadgen never writes a run over other files")
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


WORKERS_HELP = ("sending processes on this machine: N, or auto (one per usable core); default 1. One plan split "
                "between them, their records merged into one run directory, one verdict (--engine locust: N "
                "local Locust workers and a master)")


def workers_option(help_text: str = WORKERS_HELP) -> Any:
    return typer.Option("1", "--workers", metavar="N|auto", help=help_text)


def workers_flag(text: str, capture: int = 0) -> int:
    """``--workers N|auto`` as a number of processes (exit 2 on anything else); ``0``, its old meaning under
    Locust (one process), is 1, with a one-line notice."""
    from loadgen.plan.scenario import ScenarioError
    from loadgen.plan.shares import process_count

    try:
        n = process_count(text)
    except ScenarioError as exc:
        raise fail(str(exc)) from None
    if str(text).strip() == "0":
        err.print("note: --workers 0 is deprecated: it means one process, --workers 1 (the default)",
                  highlight=False, markup=False)
    if capture and n > 1:
        raise fail("--capture keeps what one process received: it works without --workers")
    return n
