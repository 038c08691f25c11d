"""The one flag vocabulary of the ``loadgen`` command line (docs/cli.md): every flag name, once, with its kind;
the old names kept for a release; and the parsers of the two kinds that carry units, time and percentages.

Rules (one way each): a time flag names the concept and its value carries the unit (``--duration 20``, ``20s``,
``2m``, ``1h``); a share or level is written ``N%`` (a bare number on a flag that took one before is read the old
way, with a warning); a boolean is a pair ``--x/--no-x``; a list is one flag, comma-separated; ``--out`` is where
a command writes, ``--reports`` the parent of run directories. Engine-mirroring ``loadgen target`` flags keep
the server's own spelling (``MIRRORED``). Data and parsers only (no typer): cli/common.py makes options of them."""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from typing import Literal, NoReturn

Kind = Literal["seconds", "percent", "bool", "count", "number", "choice", "path", "text", "list", "pairs"]
REMOVED_IN = "0.3"  # the release in which the old names go


@dataclass(frozen=True)
class Flag:
    name: str
    kind: Kind
    meaning: str


def _flags(*rows: tuple[str, Kind, str]) -> dict[str, Flag]:
    return {name: Flag(name, kind, meaning) for name, kind, meaning in rows}


FLAGS: dict[str, Flag] = _flags(
    # the target and the scenario
    ("--base-url", "text", "the OpenAI-compatible base URL ('embedded': the bundled simulator)"),
    ("--model", "text", "the model name (target commands: the model to serve)"),
    ("--api-key-env", "text", "the environment variable holding the API key"),
    ("--api", "choice", "chat or completions"),
    ("--set", "pairs", "FIELD=VALUE overrides of any scenario field (repeatable)"),
    ("--slo", "pairs", "METRIC.STAT=LIMIT objectives (repeatable)"),
    # load
    ("--rate", "list", "requests per second (sweep: a comma-separated list of steps)"),
    ("--concurrency", "list", "concurrent users (sweep: a comma-separated list of steps)"),
    ("--prompt-tokens", "number", "prompt tokens per request (also --input-len)"),
    ("--input-len", "number", "vllm bench's name for --prompt-tokens"),
    ("--output-tokens", "number", "output tokens per request (also --output-len)"),
    ("--output-len", "number", "vllm bench's name for --output-tokens"),
    ("--spread", "percent", "how far token counts spread around their value"),
    ("--dataset", "path", "a prompt dataset file (or the bundled sharegpt-sample)"),
    # time
    ("--duration", "seconds", "measured time"),
    ("--request-timeout", "seconds", "send to last byte, at most"),
    ("--drain-timeout", "seconds", "time in-flight requests get after the last send (0 allowed)"),
    ("--server-metrics-period", "seconds", "time between two scrapes of /metrics"),
    ("--step-duration", "seconds", "a sweep step's measured time"),
    ("--max-step-duration", "seconds", "a sweep's longest step"),
    ("--min-step-duration", "seconds", "a sweep search's shortest step"),
    ("--budget", "seconds", "wall time a sweep may take"),
    ("--pilot-duration", "seconds", "measured time of size's pilot"),
    ("--timeout", "seconds", "wall time of shrink's search"),
    ("--startup-timeout", "seconds", "time a bundled target gets to answer /health"),
    ("--max-error", "seconds", "the largest p99 error a step may have (bench-client)"),
    ("--window", "text", "START:END seconds of the request timeline"),
    # shares and levels
    ("--threshold", "percent", "the change a regression must exceed"),
    ("--error-rate-delta", "percent", "the error-rate change (percentage points) a regression must exceed"),
    ("--confidence", "percent", "confidence level of the intervals"),
    ("--tolerance", "percent", "a capacity search's interval width"),
    ("--margin", "percent", "the share of each limit a setting must keep"),
    ("--power", "percent", "the chance a sized run certifies"),
    ("--pilot-assurance", "percent", "the level of the pilot's one-sided bound"),
    ("--regression", "percent", "the regression compare should detect"),
    ("--share", "percent", "the share of the original gap that counts as reproduced"),
    # booleans (the pair's --no- name is its twin)
    ("--png", "bool", "PNG copies of the charts"),
    ("--progress", "bool", "the live progress bar"),
    ("--server-metrics", "bool", "scrape the target's /metrics"),
    ("--fail-fast", "bool", "stop when the first requests all fail"),
    ("--web-login", "bool", "Locust's login page"),
    ("--master", "bool", "run as a Locust master"),
    ("--markdown", "bool", "the scenario reference instead of the schema"),
    ("--json", "bool", "one JSON document for machines"),
    ("--verbose", "bool", "the evidence behind each line (check)"),
    ("--capacity", "bool", "search each candidate's capacity"),
    ("--build-only", "bool", "build llama-server and exit"),
    ("--chunked-prefill", "bool", "vLLM's chunked prefill"),
    ("--prefix-caching", "bool", "vLLM's prefix caching"),
    # places
    ("--out", "path", "where this command writes"),
    ("--reports", "path", "the parent of run directories"),
    ("--from", "path", "a run directory to size from"),
    ("--log", "path", "the server's own output"),
    ("--config", "path", "a YAML file of the simulator's engine fields (target sim)"),
    ("--trace", "path", "where the simulator writes its ground-truth trace (target sim)"),
    # counts and numbers
    ("--replays", "count", "replays per candidate"),
    ("--replicates", "count", "bootstrap replicates"),
    ("--repeat", "count", "runs of the scenario"),
    ("--capture", "count", "failed responses kept"),
    ("--workers", "count", "N|auto sending processes on this machine (both engines)"),
    ("--max-streams", "count", "the last step's streams (bench-client)"),
    ("--max-steps", "count", "sweep steps at most"),
    ("--max-tries", "count", "replays shrink may make"),
    ("--confirmations", "count", "confirmation runs of shrink's set"),
    ("--conversations", "count", "conversations in the sample dataset"),
    ("--requests", "count", "requests in the sample trace"),
    ("--seed", "number", "a random seed"),
    ("--require", "number", "the capacity sweep must reach"),
    ("--start", "number", "a capacity search's first load"),
    ("--stall-rate-delta", "number", "stalls per 1k output tokens a regression must exceed"),
    ("--stall", "number", "a stall's row in stalls.parquet"),
    ("--request", "number", "a request's seq in requests.parquet"),
    ("--port", "number", "a port"),
    ("--master-bind-port", "number", "the Locust master's port for workers"),
    ("--master-port", "number", "the Locust master's port"),
    # choices and text
    ("--engine", "choice", "asyncio or locust"),
    ("--until", "choice", "time or decided"),
    ("--find-max", "choice", "rate or concurrency"),
    ("--format", "choice", "a dataset's format"),
    ("--device", "choice", "cuda or cpu"),
    ("--preset", "choice", "the simulator's hardware/model preset (target sim)"),
    ("--host", "text", "an interface or address"),
    ("--master-bind-host", "text", "the Locust master's interface for workers"),
    ("--master-host", "text", "the Locust master's address"),
    ("--scenario", "text", "a scenario name"),
    ("--metric", "list", "metrics to compare (repeatable)"),
    ("--try", "pairs", "KEY=V1,V2 candidate server settings (repeatable)"),
    ("--server", "pairs", "KEY=VALUE the run's server settings (repeatable)"),
    ("--prompt-column", "text", "a dataset's prompt column"),
    ("--messages-column", "text", "a dataset's messages column"),
    ("--output-column", "text", "a dataset's answer column"),
    ("--layers", "count", "transformer layers"),
    ("--hidden", "count", "hidden size"),
    ("--vocab", "count", "tokenizer vocabulary size"),
    ("--help", "bool", "show the help (also -h)"),
    ("--version", "bool", "print loadgen's version"),
)

# flags of `loadgen target vllm|llamacpp` that mirror the engine's own (kept in the server's spelling)
MIRRORED: frozenset[str] = frozenset({
    "--max-num-batched-tokens", "--max-num-seqs", "--max-model-len", "--kv-cache-gib", "--dtype", "--slots",
    "--n-batch", "--ctx-per-slot", "--threads"})

# permanent second names for other tools' habits (shown in help, no warning)
SYNONYMS: dict[str, str] = {"--input-len": "--prompt-tokens", "--output-len": "--output-tokens"}

# old names, per command path, kept for one release: rewritten before parsing, with one warning each
ALIASES: dict[str, dict[str, str]] = {
    "run": {"--server-metrics-period-s": "--server-metrics-period"},
    "ui": {"--reports-dir": "--reports"},
    "compare": {"--error-rate-pp": "--error-rate-delta"},
    "sweep": {"--rates": "--rate", "--step-duration-s": "--step-duration", "--budget-s": "--budget",
              "--max-step-duration-s": "--max-step-duration", "--min-step-duration-s": "--min-step-duration"},
    "advise": {"--seeds": "--replays"},
    "size": {"--pilot-s": "--pilot-duration", "--compare-threshold": "--threshold"},
    "shrink": {"--timeout-s": "--timeout"},
    "target vllm": {"--startup-timeout-s": "--startup-timeout"},
    "target llamacpp": {"--startup-timeout-s": "--startup-timeout"},
}

# the value form of a boolean (`--chunked-prefill on|off`): rewritten to the pair's names, with a warning
VALUE_ALIASES: dict[str, frozenset[str]] = {
    "target vllm": frozenset({"--chunked-prefill", "--prefix-caching"})}
TRUE_WORDS, FALSE_WORDS = frozenset({"on", "true", "yes", "1"}), frozenset({"off", "false", "no", "0"})

# what help calls a flag's value where its option names none (cli/aliases.py name_values): by command and flag,
# by flag, else by kind; never typer's type names (<list[str]>, <int range>). An argument is its name in capitals.
KIND_METAVARS: dict[Kind, str] = {"seconds": "TIME", "percent": "PCT", "count": "N", "number": "N", "path": "PATH",
                                  "text": "TEXT", "choice": "CHOICE", "list": "LIST", "pairs": "KEY=VALUE"}
METAVARS: dict[str, str] = {
    "--base-url": "URL", "--model": "NAME", "target llamacpp --model": "GGUF", "--api-key-env": "VAR",
    "--api": "chat|completions", "--set": "FIELD=VALUE", "--slo": "METRIC.STAT=LIMIT", "--try": "KEY=V1,V2",
    "--server": "KEY=VALUE", "--rate": "REQ/S,…", "--concurrency": "N,…", "--metric": "METRIC.STAT",
    "--dataset": "FILE|NAME", "--window": "START:END", "--scenario": "NAME", "--engine": "asyncio|locust",
    "--until": "time|decided", "--find-max": "rate|concurrency", "--format": "FORMAT", "--host": "HOST",
    "--master-host": "HOST", "--master-bind-host": "HOST", "--port": "PORT", "--master-port": "PORT",
    "--master-bind-port": "PORT", "--seed": "SEED", "--stall": "ROW", "--request": "SEQ", "--require": "LOAD",
    "--start": "LOAD", "--from": "RUN_DIR", "--reports": "DIR", "--log": "FILE",
    "--config": "FILE", "--trace": "FILE", "--prompt-column": "COLUMN", "--messages-column": "COLUMN",
    "--output-column": "COLUMN", "--kv-cache-gib": "GIB", "--dtype": "DTYPE"}

_UNITS = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0, "h": 3600.0}
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)\s*$")


class FlagError(Exception):
    """A flag's value that cannot be read: one line naming the flag and the value (cli/common.py: exit 2)."""


def _bad(flag: str, text: object, why: str) -> NoReturn:
    raise FlagError(f"{flag} {text}: {why}")


def warn(line: str) -> None:
    """One deprecation line on stderr (never on stdout: scripts parse it)."""
    print(f"warning: {line}", file=sys.stderr, flush=True)


def seconds(text: str | float, flag: str, zero_ok: bool = False) -> float:
    """``20``, ``20s``, ``1.5m``, ``2h``, ``500ms`` → seconds (finite, above 0; 0 only where ``zero_ok``)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _TIME.match(text.lower())
        if m is None or m.group(2) not in _UNITS:
            _bad(flag, text, "give a time, e.g. 20, 20s, 2m or 1h")
        value = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        _bad(flag, text, "give a finite time above 0" + (" (or 0)" if zero_ok else ""))
    return value


def percent(text: str | float, flag: str, legacy: Literal["percent", "fraction"] | None = None) -> float:
    """``10%`` → 0.1. A bare number is refused, except on a flag that took one before (``legacy``: it meant
    percent, ``10``, or a fraction, ``0.95``), where it is read the old way with a warning."""
    if isinstance(text, (int, float)):
        return float(text)
    raw = text.strip()
    number = raw.removesuffix("%").strip()
    try:
        value = float(number)
    except ValueError:
        _bad(flag, repr(text), "give a percentage, e.g. 10%")
    if not math.isfinite(value):
        _bad(flag, text, "give a finite percentage, e.g. 10%")
    if raw.endswith("%"):
        return value / 100
    if legacy is None:
        _bad(flag, text, f"write a percentage: {flag} {number}%")
    fraction = value / 100 if legacy == "percent" else value
    warn(f"{flag} {raw}: write {flag} {fraction * 100:g}% (a bare number goes in {REMOVED_IN})")
    return fraction


def numbers(text: str, flag: str) -> list[float]:
    """A comma-separated list of finite numbers above 0 (``--rate 1,2,4``)."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _bad(flag, repr(text), f"give numbers separated by commas, e.g. {flag} 1,2,4,8")
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        _bad(flag, repr(text), "every step must be a finite number above 0")
    return values


__all__ = ["ALIASES", "FLAGS", "Flag", "FlagError", "MIRRORED", "SYNONYMS", "VALUE_ALIASES", "numbers", "percent",
           "seconds", "warn"]
