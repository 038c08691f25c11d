"""The quick-start flags the load commands share (``run``, ``sweep``, ``size``; ``check`` takes the target's):
one definition of each option, the scenario they make (plan/quick.py: ``QUICK_YAML`` for no scenario, else the
file's single class and load overridden), and the command lines suggested in errors, built from what the user
gave so that each runs as printed (``loadgen run --rate 1,2,4`` → ``loadgen sweep --rate 1,2,4 …``)."""

from __future__ import annotations

import atexit
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from loadgen.cli import vocabulary
from loadgen.cli.common import FLAGS, Parser, console, fail, percent_option, scenario_overrides, seconds_option
from loadgen.plan import bundled, quick

if TYPE_CHECKING:
    from loadgen.plan.scenario import Scenario

APIS = ("chat", "completions")


class Loads(tuple[float, ...]):
    """What :func:`loads` parses: the values given (a class, not ``list[float]``, which typer would read as a
    repeatable option)."""


def loads(flag: str, kind: str) -> Parser:
    """``--rate``/``--concurrency`` of a command that runs one load: a list of values (more than one is a
    sweep's, which the command says with the sweep's command line); each a number above 0 (users: whole)."""
    def parse(text: Any) -> Loads:
        try:
            values = vocabulary.numbers(str(text), flag)
        except vocabulary.FlagError:
            example = "4" if kind == "number" else "8"
            raise vocabulary.FlagError(f"{flag} {text!r}: give a number above 0, e.g. {flag} {example}") from None
        if kind == "count" and any(v != int(v) for v in values):
            raise vocabulary.FlagError(f"{flag} {text}: give a whole number of users")
        return Loads(values)
    return Parser("list", flag, parse)


# the options (one definition each; a command's own wording where it differs)
MODEL = typer.Option(None, "--model", help="model name ('auto' = first of /v1/models)")
API_KEY_ENV = typer.Option(None, "--api-key-env", help="environment variable with the API key")
PROMPT_TOKENS = typer.Option(None, "--prompt-tokens", "--input-len", min=1,
                             help="prompt tokens per request (quick start: 512)")
OUTPUT_TOKENS = typer.Option(None, "--output-tokens", "--output-len", min=1,
                             help="output tokens per request (quick start: 128)")
SPREAD = percent_option(None, "--spread", "token counts drawn uniformly within ±this share of --prompt-tokens/"
                        "--output-tokens (vllm bench's --random-range-ratio), e.g. 10%")
DATASET = typer.Option(None, "--dataset", help="prompts from a file (jsonl, csv, parquet, ShareGPT .json), or "
                       "sharegpt-sample (shipped)")
SLO = typer.Option([], "--slo", metavar="METRIC.STAT=LIMIT", help="an objective, e.g. ttft_ms.p99=2000 or "
                   "error_rate.max=1% (repeatable; quick start: no failed request)")
API = typer.Option(None, "--api", help="chat or completions (quick start: chat)")
REQUEST_TIMEOUT = seconds_option(None, "--request-timeout", "from send to a request's last byte, at most "
                                 "(target.request_timeout_s, default 600s)")
DRAIN_TIMEOUT = seconds_option(None, "--drain-timeout", "time in-flight requests get after the last send "
                               "(load.drain_timeout_s, default 30s)", zero_ok=True)


def base_url_option(help_text: str) -> Any:
    return typer.Option(None, "--base-url", help=help_text)


def duration_option(help_text: str) -> Any:
    return seconds_option(None, "--duration", help_text)


@dataclass
class Given:
    """The quick-start flags as the user gave them (None, empty: not given), for the scenario and for the
    command lines suggested from them."""

    base_url: Optional[str] = None
    model: Optional[str] = None
    api_key_env: Optional[str] = None
    prompt_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    spread: Optional[float] = None
    dataset: Optional[Path] = None
    slo: list[str] = field(default_factory=list)
    api: Optional[str] = None
    duration_s: Optional[float] = None
    request_timeout_s: Optional[float] = None
    drain_timeout_s: Optional[float] = None
    sets: list[str] = field(default_factory=list)

    def check(self) -> None:
        if self.api is not None and self.api not in APIS:
            raise fail(f"--api {self.api!r}: choose chat or completions")

    def load(self, rate_per_s: Optional[float] = None, concurrency: Optional[int] = None) -> quick.QuickLoad:
        dataset = None if self.dataset is None else bundled.dataset_path(self.dataset)
        return quick.QuickLoad(rate_per_s, concurrency, self.prompt_tokens, self.output_tokens, self.spread,
                               dataset, tuple(self.slo), self.api)

    def overrides(self) -> list[str]:
        """--set and the target's and time flags, as field overrides (applied last)."""
        return scenario_overrides(self.sets, self.base_url, self.model, self.api_key_env, seconds={
            "load.duration_s": self.duration_s, "target.request_timeout_s": self.request_timeout_s,
            "load.drain_timeout_s": self.drain_timeout_s})

    def args(self) -> list[str]:
        """The flags again, as a command line's words (for a suggested command)."""
        words: list[str] = []
        for flag, value in (("--base-url", self.base_url), ("--model", self.model),
                            ("--api-key-env", self.api_key_env), ("--api", self.api),
                            ("--prompt-tokens", self.prompt_tokens), ("--output-tokens", self.output_tokens),
                            ("--dataset", self.dataset)):
            words += [] if value is None else [flag, str(value)]
        words += [] if self.spread is None else ["--spread", f"{self.spread * 100:g}%"]
        for flag, seconds in (("--duration", self.duration_s), ("--request-timeout", self.request_timeout_s),
                              ("--drain-timeout", self.drain_timeout_s)):
            words += [] if seconds is None else [flag, f"{seconds:g}s"]
        for item in self.slo:
            words += ["--slo", item]
        for item in self.sets:
            words += ["--set", item]
        return words


def command_line(*words: object) -> str:
    """``loadgen`` and the words, each quoted for a POSIX shell where it needs to be."""
    return " ".join(["loadgen", *(shlex.quote(str(w)) for w in words)])


def scenario(arg: Optional[Path], q: quick.QuickLoad, sets: list[str], say_slo: bool = True) -> Scenario:
    """The quick start's scenario (``arg`` None), or the file's (a bundled one by name) with the quick flags
    as overrides of its single class and its load; ``sets`` (--set and the dedicated flags) apply last. Bad
    input: one line, exit 2."""
    from loadgen.plan.scenario import ScenarioError

    try:
        if arg is None:
            sc = _load(_quick_file(), quick.overrides(q) + sets, q)
            if not q.slo and say_slo:
                console.print(quick.DEFAULT_SLO_LINE, highlight=False, markup=False)
            return sc
        path = bundled.resolve_scenario_arg(arg)
        if path != arg:
            console.print(f"note: {arg} is the bundled scenario {path.stem} (loadgen scenario copy {path.stem}: a "
                          "copy to edit)", highlight=False, markup=False)
        sc = _load(path, sets, q)
        if not q.given() and q.api is None:
            return sc
        return _load(path, quick.overrides(q, len(sc.workload.classes), quick=False) + sets, q)
    except (ScenarioError, quick.QuickError) as exc:
        raise fail(str(exc)) from None


def _quick_file() -> Path:
    """The quick start's scenario file, kept until the command exits: a sweep's steps and Locust's workers load
    the scenario again from its file and overrides."""
    folder = Path(tempfile.mkdtemp(prefix="loadgen-quick-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "quick-start-scenario.yaml"
    path.write_text(quick.QUICK_YAML)
    return path


def _load(path: Path, items: list[str], q: quick.QuickLoad) -> Scenario:
    """The scenario; an error in a field a flag set names the flag (``--slo ttft_ms.p9=1``), not the field."""
    from loadgen import api

    return api.load_scenario(path, items, {**FLAGS, **quick.FLAGS, **quick.slo_flags(q)})


__all__ = ["API", "API_KEY_ENV", "DATASET", "DRAIN_TIMEOUT", "Given", "Loads", "MODEL", "OUTPUT_TOKENS",
           "PROMPT_TOKENS", "REQUEST_TIMEOUT", "SLO", "SPREAD", "base_url_option", "command_line", "duration_option",
           "loads", "scenario"]
