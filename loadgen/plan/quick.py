"""``loadgen run`` without a scenario file: the quick-start flags (``--rate``, ``--concurrency``,
``--prompt-tokens``/``--input-len``, ``--output-tokens``/``--output-len``, ``--spread``, ``--dataset``, ``--slo``)
as scenario overrides. Pure: the command line loads ``QUICK_YAML`` (or the user's file) through the normal loader
with ``overrides(...)`` so ``${VAR}``, ``--set`` and validation apply as to any scenario, the way ``loadgen check``
reads its built-in one (run/check.py). ``--spread`` is vllm bench's ``--random-range-ratio``: lengths drawn
uniformly from N(1-s) to N(1+s)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from loadgen.core.vocabulary import ObjectiveId

DEFAULT_RATE_PER_S = 1.0
DEFAULT_DURATION_S = 30.0
DEFAULT_PROMPT_TOKENS = 512
DEFAULT_OUTPUT_TOKENS = 128
DEFAULT_SLO_LINE = "SLO: no failed request (the default; add one: --slo ttft_ms.p99=2000)"  # fits 80 columns

QUICK_YAML = f"""\
# loadgen run's quick start: a scenario from the command line's flags (loadgen/plan/quick.py)
name: quick
description: loadgen run from flags (no scenario file)
target: {{base_url: embedded, model: auto, api: chat}}
load: {{arrival: poisson, rate_per_s: {DEFAULT_RATE_PER_S}, duration_s: {DEFAULT_DURATION_S}, warmup_s: 0,
        max_in_flight: 256}}
workload:
  classes:
    - name: quick
      prompt_tokens: {{dist: fixed, value: {DEFAULT_PROMPT_TOKENS}}}
      output_tokens: {{dist: fixed, value: {DEFAULT_OUTPUT_TOKENS}}}
slo:
  error_rate: {{max: 0}}  # no failed request, so a clean run passes
"""

# the field behind each quick flag, so that a validation error blames the flag (plan/scenario_file.py)
FLAGS = {"load.rate_per_s": "--rate", "load.concurrency": "--concurrency", "load.arrival": "--rate/--concurrency",
         "workload.classes.0.prompt_tokens": "--prompt-tokens", "workload.classes.0.output_tokens": "--output-tokens",
         "workload.classes.0.dataset": "--dataset", "target.api": "--api"}


class QuickError(ValueError):
    """A quick flag that cannot be used as given: one line (the command line exits 2)."""


@dataclass(frozen=True)
class QuickLoad:
    """The quick-start flags as given (None: not given)."""

    rate_per_s: float | None = None
    concurrency: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    spread: float | None = None  # a fraction, 0 <= spread < 1
    dataset: Path | None = None
    slo: tuple[str, ...] = ()
    api: str | None = None

    def given(self) -> bool:
        """Does any flag change the load or the workload (the part a scenario file's single class defines)?"""
        return any(v is not None for v in (self.rate_per_s, self.concurrency, self.prompt_tokens,
                                           self.output_tokens, self.spread, self.dataset)) or bool(self.slo)


def lengths(value: int, spread: float | None) -> dict[str, object]:
    """A token-length distribution: ``value`` exactly, or uniform over value*(1 ± spread)."""
    if value < 1:
        raise QuickError(f"a token count of {value}: give 1 or more")
    low, high = max(1, round(value * (1 - (spread or 0)))), round(value * (1 + (spread or 0)))
    if high <= low:
        return {"dist": "fixed", "value": value}
    return {"dist": "uniform", "min": low, "max": high}


def slo_override(item: str) -> str:
    """``ttft_ms.p99=2000`` → ``slo.ttft_ms.p99=2000``; ``error_rate.max=1%`` → ``slo.error_rate.max=0.01``."""
    name, sep, limit = item.partition("=")
    try:
        objective = ObjectiveId.parse(name.strip()) if sep else None
    except ValueError:
        objective = None
    if objective is None or not objective.stat or objective.scope or not limit.strip():
        raise QuickError(f"--slo {item}: write METRIC.STAT=LIMIT, e.g. --slo ttft_ms.p99=2000 or "
                         "--slo error_rate.max=1% (a class's objective: --set slo.<...>)")
    text = limit.strip()
    try:
        value = float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise QuickError(f"--slo {item}: the limit {text!r} is not a number") from None
    return f"slo.{objective.metric}.{objective.stat}={json.dumps(value)}"


def slo_flags(q: QuickLoad) -> dict[str, str]:
    """Each --slo's field, and the flag as given (for the loader's errors)."""
    return {slo_override(item).partition("=")[0]: f"--slo {item}" for item in q.slo}


def overrides(q: QuickLoad, classes: int = 1, quick: bool = True) -> list[str]:
    """The scenario overrides (``FIELD=VALUE``) for the flags of ``q``. ``quick``: over ``QUICK_YAML`` (the
    lengths' defaults apply); else over a scenario file with ``classes`` classes (refused if more than one and a
    class flag is given)."""
    if q.rate_per_s is not None and q.concurrency is not None:
        raise QuickError("--rate and --concurrency: give one (--rate: open loop, req/s; --concurrency: N users)")
    items: list[str] = []
    if q.rate_per_s is not None:
        items += ["load.arrival=poisson", f"load.rate_per_s={json.dumps(q.rate_per_s)}"]
    if q.concurrency is not None:
        items += ["load.arrival=concurrency", f"load.concurrency={q.concurrency}", "load.rate_per_s=null"]
    items += _class_overrides(q, classes, quick)
    if q.api is not None:
        items.append(f"target.api={json.dumps(q.api)}")
    return items + [slo_override(s) for s in q.slo]


def _class_overrides(q: QuickLoad, classes: int, quick: bool) -> list[str]:
    given = [flag for flag, value in (("--prompt-tokens", q.prompt_tokens), ("--output-tokens", q.output_tokens),
                                      ("--spread", q.spread), ("--dataset", q.dataset)) if value is not None]
    if not given:
        return []
    if classes > 1:
        raise QuickError(f"{given[0]}: this scenario has {classes} request classes; set one with "
                         f"--set workload.classes.<i>.<field>=VALUE")
    if q.spread is not None and not 0 <= q.spread < 1:
        raise QuickError(f"--spread {q.spread * 100:g}%: give 0% up to below 100%")
    if q.dataset is not None and q.prompt_tokens is not None:
        raise QuickError("--dataset and --prompt-tokens: the dataset's rows are the prompts; give one")
    prompt = q.prompt_tokens if q.prompt_tokens is not None or not quick else DEFAULT_PROMPT_TOKENS
    output = q.output_tokens if q.output_tokens is not None or not quick or q.dataset else DEFAULT_OUTPUT_TOKENS
    if q.spread is not None and prompt is None and output is None:
        raise QuickError("--spread goes with --prompt-tokens or --output-tokens (the lengths it spreads)")
    key = "workload.classes.0"
    items: list[str] = []
    if q.dataset is not None:
        dataset = {"path": str(q.dataset.expanduser().resolve()), "format": "auto"}
        items += [f"{key}.dataset={json.dumps(dataset)}", f"{key}.prompt_tokens=null"]
        if output is None:
            items.append(f"{key}.output_tokens=null")
    elif prompt is not None:
        items.append(f"{key}.prompt_tokens={json.dumps(lengths(prompt, q.spread))}")
    if output is not None:
        items.append(f"{key}.output_tokens={json.dumps(lengths(output, q.spread))}")
    return items


__all__ = ["DEFAULT_SLO_LINE", "FLAGS", "QUICK_YAML", "QuickError", "QuickLoad", "lengths", "overrides",
           "slo_flags", "slo_override"]
