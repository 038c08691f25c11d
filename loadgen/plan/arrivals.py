"""Arrivals and lengths, pure and seeded: length distributions, open-loop send offsets (constant, Poisson, gamma,
stages, ramps) and trace files.

A ramp is an inhomogeneous Poisson process (or, with ``poisson: false``, evenly spaced in expected arrivals)
whose rate goes from ``start_rate_per_s`` to ``end_rate_per_s`` over the run's warm-up + duration, linearly or
exponentially, as Locust's spawn rate and k6's ramping-arrival-rate do: arrivals are drawn at rate 1 in the
cumulative-rate clock Λ(t) and mapped back through Λ's inverse.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path

from loadgen.plan import nesting
from loadgen.plan.scenario import (MAX_PLAN_REQUESTS, MAX_TOKENS, Empirical, Exponential, Fixed, LogNormal,
                                   Mixture, Normal, Ramp, Scenario, ScenarioError, TraceFile,
                                   Uniform)


# ---- distributions -------------------------------------------------------------------------------------
def sample_length(dist: object, rng: random.Random) -> int:
    value = _draw(dist, rng)
    fields = vars(dist)  # a model's values (getattr of an absent field goes through pydantic's slow __getattr__)
    lo: int = fields.get("min", 1)
    hi: int = fields.get("max") or MAX_TOKENS  # unbounded tails (lognormal, exponential) stop here
    return min(max(lo, round(value)), hi)


def _draw(dist: object, rng: random.Random) -> float:
    if isinstance(dist, Fixed):
        return dist.value
    if isinstance(dist, Uniform):
        return rng.randint(dist.min, dist.max)
    if isinstance(dist, Normal):
        return rng.gauss(dist.mean, dist.std)
    if isinstance(dist, LogNormal):
        return dist.median * math.exp(rng.gauss(0.0, dist.sigma))
    if isinstance(dist, Exponential):
        return rng.expovariate(1.0 / dist.mean)
    if isinstance(dist, Empirical):
        return _draw_empirical(dist, rng)
    if isinstance(dist, Mixture):
        component = rng.choices(dist.components, weights=[c.weight for c in dist.components])[0]
        return sample_length(component.dist, rng)
    raise TypeError(f"unknown distribution {dist!r}")


_FILE_CACHE: dict[Path, list[int]] = {}


def _draw_empirical(dist: Empirical, rng: random.Random) -> float:
    if dist.histogram is not None:
        lo, hi, _ = rng.choices(dist.histogram, weights=[b[2] for b in dist.histogram])[0]
        return rng.randint(lo, hi)
    assert dist.file is not None
    return rng.choice(load_lengths_file(dist.file))


def load_lengths_file(path: Path) -> list[int]:
    """One length per line (the first comma-separated field; a non-numeric header line is skipped)."""
    if path not in _FILE_CACHE:
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ScenarioError(f"{path}: cannot read lengths file: {exc.strerror}") from None
        values = [_length(f, path, n) for n, line in enumerate(lines, 1)
                  if (f := line.split(",")[0].strip()) and _number(f)]
        if not values:
            raise ScenarioError(f"{path}: no lengths found (one number per line)")
        _FILE_CACHE[path] = values
    return _FILE_CACHE[path]


def _length(text: str, path: Path, line: int) -> int:
    value = float(text)
    if not math.isfinite(value) or not 0 <= value <= MAX_TOKENS:
        raise ScenarioError(f"{path}:{line}: {text!r} is not a length (0..{MAX_TOKENS:,} tokens)")
    return int(value)


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


# ---- arrivals ------------------------------------------------------------------------------------------
def arrival_offsets_s(s: Scenario, rng: random.Random) -> list[float]:
    """Intended send offsets (seconds from start) of an open-loop scenario, warm-up included."""
    load = s.load
    if load.arrival == "stages":
        return _stage_offsets(s, rng)
    if load.arrival == "ramp":
        return _ramp_offsets(s, rng)
    horizon = load.warmup_s + load.duration_s if load.duration_s is not None else math.inf
    limit = load.requests if load.requests is not None else math.inf
    rate = load.rate_per_s
    assert rate is not None
    out: list[float] = []
    t = 0.0
    while len(out) < limit:
        if load.arrival == "poisson":
            t += rng.expovariate(rate)
        elif load.arrival == "gamma":
            t += rng.gammavariate(load.burstiness, 1.0 / (rate * load.burstiness))
        elif out:
            t += 1.0 / rate
        if t >= horizon:
            break
        out.append(t)
        _check_plan_size(len(out))
    return out


def _check_plan_size(n: int) -> None:
    if n > MAX_PLAN_REQUESTS:  # the model checked the expected count; this bounds an unlucky draw's memory too
        raise ScenarioError(f"the plan holds over {MAX_PLAN_REQUESTS:,} requests: lower the rate or the duration")


def _stage_offsets(s: Scenario, rng: random.Random) -> list[float]:
    out: list[float] = []
    start = 0.0
    for stage in s.load.stages or []:
        t = start
        while True:
            t += rng.expovariate(stage.rate_per_s)
            if t >= start + stage.duration_s:
                break
            out.append(t)
            _check_plan_size(len(out))
        start += stage.duration_s
    return out[: s.load.requests] if s.load.requests else out


def _ramp_offsets(s: Scenario, rng: random.Random) -> list[float]:
    ramp, load = s.load.ramp, s.load
    assert ramp is not None and load.duration_s is not None
    horizon = load.warmup_s + load.duration_s
    total = ramp.mean_rate_per_s() * horizon  # Λ(horizon): the expected number of arrivals
    limit = load.requests if load.requests is not None else math.inf
    out: list[float] = []
    cumulative = 0.0
    while len(out) < limit:
        cumulative += rng.expovariate(1.0) if ramp.poisson else (1.0 if out else 0.5)
        if cumulative >= total:
            break
        out.append(ramp_time_s(ramp, horizon, cumulative))
        _check_plan_size(len(out))
    return out


def ramp_time_s(ramp: Ramp, horizon_s: float, arrivals: float) -> float:
    """The inverse of the ramp's cumulative rate: when the expected number of arrivals reaches ``arrivals``."""
    r0, r1, T = ramp.start_rate_per_s, ramp.end_rate_per_s, horizon_s
    if math.isclose(r0, r1):
        return arrivals / r0
    if ramp.shape == "linear":  # Λ(t) = r0·t + (r1 − r0)·t² / 2T
        slope = (r1 - r0) / T
        return (-r0 + math.sqrt(max(0.0, r0 * r0 + 2 * slope * arrivals))) / slope
    k = math.log(r1 / r0)  # Λ(t) = r0·T/k · (e^{k·t/T} − 1)
    return T / k * math.log1p(arrivals * k / (r0 * T))


@dataclass(frozen=True, slots=True)
class TraceRow:
    offset_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] | None = None  # mooncake: the hash ids of its prompt's blocks


def read_trace_file(s: Scenario) -> list[TraceRow]:
    spec = s.load.trace
    assert spec is not None
    try:
        text = spec.path.read_text()
        jsonl = spec.path.suffix == ".jsonl" or spec.format == "mooncake"
        rows = ([nesting.loads(line, str(spec.path), n) for n, line in enumerate(text.splitlines(), 1)
                 if line.strip()] if jsonl else list(csv.DictReader(text.splitlines())))
    except OSError as exc:
        raise ScenarioError(f"load.trace.path: cannot read {spec.path}: {exc.strerror}") from None
    except ScenarioError:  # a ValueError too: a row nested too deep, named already
        raise
    except (ValueError, csv.Error) as exc:
        raise ScenarioError(f"{spec.path}: not valid {'JSONL' if jsonl else 'CSV'}: {exc}") from None
    out = [_trace_row(spec, row, n) for n, row in enumerate(rows, start=1)]
    if not out:
        raise ScenarioError(f"{spec.path}: the trace has no rows")
    _check_plan_size(len(out))
    first = min(r.offset_s for r in out)
    return sorted((TraceRow(r.offset_s - first, r.prompt_tokens, r.output_tokens, r.blocks) for r in out),
                  key=lambda r: r.offset_s)


def _trace_row(spec: TraceFile, row: object, n: int) -> TraceRow:
    mooncake = spec.format == "mooncake"
    time_col, prompt_col, output_col = (("timestamp", "input_length", "output_length") if mooncake else
                                        (spec.time_column, spec.prompt_column, spec.output_column))
    try:
        assert isinstance(row, dict)
        blocks = tuple(int(h) for h in row["hash_ids"]) if mooncake else None
        prompt = int(row[prompt_col])
        if blocks is not None and not (len(blocks) - 1) * spec.block_tokens < prompt <= len(blocks) * \
                spec.block_tokens:
            raise ValueError(f"{prompt} tokens do not fill {len(blocks)} blocks of {spec.block_tokens}")
        output, t_s = int(row[output_col]), float(row[time_col]) / (1000 if mooncake else 1) / spec.speedup
        if not (0 < prompt <= MAX_TOKENS and 0 < output <= MAX_TOKENS and math.isfinite(t_s)):
            raise ValueError(f"lengths must be 1..{MAX_TOKENS:,} and the time finite")
        return TraceRow(t_s, prompt, output, blocks)
    except (AssertionError, KeyError, ValueError, TypeError, OverflowError) as exc:
        extra = ", hash_ids (a list)" if mooncake else ""
        raise ScenarioError(f"{spec.path}: row {n}: needs numeric {time_col}, {prompt_col}, {output_col}{extra} "
                            f"({exc!r})") from None
