"""The start banner (issue 40): what is about to be sent where, in one glance, before the first request —
target (its URL redacted), model, load, token lengths, duration and warm-up, the objectives and the run directory;
wrapped at the console's width, never cut. Pure: text from the scenario and the resolved target."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from loadgen import __version__
from loadgen.core.secrets import redact_url


def load_words(load: Any) -> str:
    """'poisson 4 req/s', '8 users (closed loop)', 'stages', 'trace …'."""
    if load.arrival == "concurrency":
        return f"{load.concurrency} users (closed loop)"
    if load.rate_per_s is not None:
        return f"{load.arrival} {load.rate_per_s:g} req/s"
    if load.arrival == "ramp" and load.ramp is not None:
        return f"ramp {load.ramp.start_rate_per_s:g} to {load.ramp.end_rate_per_s:g} req/s"
    if load.arrival == "stages" and load.stages:
        return "stages " + ", ".join(f"{s.rate_per_s:g}" for s in load.stages) + " req/s"
    return load.arrival


def length_words(dist: Any) -> str:
    """A length distribution in a few characters: '512', '461-563', 'normal ~512'."""
    if dist is None:
        return "–"
    if dist.dist == "fixed":
        return str(dist.value)
    if dist.dist == "uniform":
        return f"{dist.min}-{dist.max}"
    mean = getattr(dist, "mean", None)
    return f"{dist.dist} ~{mean:g}" if isinstance(mean, (int, float)) else dist.dist


def tokens_words(classes: list[Any]) -> str:
    """'512/128 tok' for one class; the first class and how many more otherwise; datasets named as such."""
    first = classes[0]
    if first.dataset is not None and first.prompt_tokens is None:
        text = f"dataset {Path(str(first.dataset.path)).name}"
    else:
        text = f"{length_words(first.prompt_tokens)}/{length_words(first.output_tokens)} tok"
    return text + (f" (+{len(classes) - 1} classes)" if len(classes) > 1 else "")


def is_limit(field: str) -> bool:
    """A field that is an objective's limit (``max``, ``min_ratio``, ``max_per_1k_tokens``), not a setting such as
    ``min_gap_ms`` or a good request's own limit (``goodput.ttft_ms``)."""
    return field in ("max", "min") or (field.startswith(("max_", "min_")) and not field.endswith("_ms"))


def slo_count(slo: BaseModel) -> int:
    """The objectives the scenario declares: each percentile limit of a metric, each max/min of the others."""
    n = 0
    for name in slo.model_fields_set:
        value = getattr(slo, name)
        if isinstance(value, BaseModel) and callable(getattr(value, "items", None)):
            n += len(value.items())
        elif isinstance(value, BaseModel):
            n += sum(1 for f in value.model_fields_set if is_limit(f) and getattr(value, f) is not None)
    return n


def duration_words(load: Any) -> str:
    if load.duration_s is not None:
        text = f"{load.duration_s:g} s"
    elif load.requests is not None:
        text = f"{load.requests} requests"
    else:
        text = "the plan's length"
    return text + f" (+{load.warmup_s:g} s warm-up)"


def banner_lines(scenario: Any, target: Any, out_dir: Path | str | None, width: int) -> list[str]:
    """``loadgen 0.1.0 → URL · model M (engine) · load · tokens · duration · SLOs · out dir``, wrapped at
    ``width`` on the separators (a part longer than the width folds, never cut)."""
    engine = f" ({target.engine})" if getattr(target, "engine", None) else ""
    n = slo_count(scenario.slo)
    slos = f"{n} SLO{'s' if n != 1 else ''}" if n else "SLO: no failed request (add --slo METRIC.STAT=LIMIT)"
    if n and "error_rate" not in scenario.slo.model_fields_set:
        slos += " + no failed request"
    parts = [f"loadgen {__version__} → {redact_url(target.base_url)}", f"model {target.model}{engine}",
             load_words(scenario.load), tokens_words(scenario.workload.classes), duration_words(scenario.load),
             slos] + ([str(out_dir)] if out_dir is not None else [])
    lines: list[str] = []
    for part in parts:
        joined = f"{lines[-1]} · {part}" if lines else part
        if lines and len(joined) <= width:
            lines[-1] = joined
        else:
            lines += textwrap.wrap(part, width, break_on_hyphens=False, subsequent_indent="  ") or [part]
    return lines
