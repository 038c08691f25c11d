"""The plan: (Scenario, seed) → every request's intended send offset, class and lengths. Pure.

Open-loop arrivals are computed in full before the first send. Request ``i``'s class and lengths come from its
own seeded generator, so they do not depend on how many requests come before it or on timing; a closed-loop
run of unknown length takes them one by one with ``Plan.request(i)``.
"""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from loadgen.plan.scenario import (MAX_PLAN_REQUESTS, MAX_TOKENS, Empirical, Exponential, Fixed, LogNormal, Mixture, Normal,
                       RequestClass, Scenario, ScenarioError, Uniform)


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    seq: int
    t_intended_offset_ns: int  # from the run's start; 0 in closed loop (the driver stamps the real time)
    class_name: str
    prompt_tokens: int
    output_tokens: int
    warmup: bool


# ---- distributions -------------------------------------------------------------------------------------
def sample_length(dist: object, rng: random.Random) -> int:
    value = _draw(dist, rng)
    lo = getattr(dist, "min", 1)
    hi = getattr(dist, "max", None) or MAX_TOKENS  # unbounded tails (lognormal, exponential) stop here
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
        values = [int(float(f)) for line in lines if (f := line.split(",")[0].strip()) and _number(f)]
        if not values:
            raise ScenarioError(f"{path}: no lengths found (one number per line)")
        _FILE_CACHE[path] = values
    return _FILE_CACHE[path]


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


@dataclass(frozen=True, slots=True)
class TraceRow:
    offset_s: float
    prompt_tokens: int
    output_tokens: int


def read_trace_file(s: Scenario) -> list[TraceRow]:
    spec = s.load.trace
    assert spec is not None
    try:
        text = spec.path.read_text()
    except OSError as exc:
        raise ScenarioError(f"load.trace.path: cannot read {spec.path}: {exc.strerror}") from None
    rows = ([json.loads(line) for line in text.splitlines() if line.strip()] if spec.path.suffix == ".jsonl"
            else list(csv.DictReader(text.splitlines())))
    out = []
    for n, row in enumerate(rows, start=1):
        try:
            out.append(TraceRow(float(row[spec.time_column]) / spec.speedup, int(row[spec.prompt_column]),
                                int(row[spec.output_column])))
        except (KeyError, ValueError, TypeError) as exc:
            raise ScenarioError(f"{spec.path}: row {n}: needs numeric {spec.time_column}, {spec.prompt_column}, "
                                f"{spec.output_column} ({exc!r})") from None
    if not out:
        raise ScenarioError(f"{spec.path}: the trace has no rows")
    _check_plan_size(len(out))
    first = min(r.offset_s for r in out)
    return sorted((TraceRow(r.offset_s - first, r.prompt_tokens, r.output_tokens) for r in out),
                  key=lambda r: r.offset_s)


# ---- the plan ------------------------------------------------------------------------------------------
class Plan:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.closed_loop = scenario.load.arrival == "concurrency"
        self._classes = scenario.workload.classes
        self._weights = [c.weight for c in self._classes]
        self._trace = read_trace_file(scenario) if scenario.load.arrival == "trace" else None
        rng = random.Random(f"arrivals:{scenario.seed}")
        self.offsets_s: list[float] | None = (None if self.closed_loop else
                                              [r.offset_s for r in self._trace] if self._trace else
                                              arrival_offsets_s(scenario, rng))
        self.requests: list[PlannedRequest] | None = (
            [self.request(i) for i in range(len(self.offsets_s))] if self.offsets_s is not None else None)

    @property
    def size(self) -> int | None:
        """Number of planned requests; None for a closed loop bounded by time only."""
        if self.requests is not None:
            return len(self.requests)
        return self.scenario.load.requests

    def request(self, seq: int) -> PlannedRequest:
        rng = random.Random(f"request:{self.scenario.seed}:{seq}")
        cls: RequestClass = rng.choices(self._classes, weights=self._weights)[0]
        prompt = sample_length(cls.prompt_tokens, rng)
        output = sample_length(cls.output_tokens, rng)
        offset_s = self.offsets_s[seq] if self.offsets_s is not None else 0.0
        if self._trace is not None:
            prompt, output = self._trace[seq].prompt_tokens, self._trace[seq].output_tokens
        warmup = offset_s < self.scenario.load.warmup_s if not self.closed_loop else False
        return PlannedRequest(seq, int(offset_s * 1e9), cls.name, prompt, output, warmup)

    def hard_end_s(self, drain_timeout_s: float) -> float | None:
        """Seconds after the first planned send at which the run ends, whatever is still in flight: the last
        send (closed loop: the end of warm-up + duration) plus the drain. None: a closed loop bounded only by
        its request count, each request bounded by ``target.request_timeout_s``."""
        if self.offsets_s is not None:
            return (self.offsets_s[-1] if self.offsets_s else 0.0) + drain_timeout_s
        load = self.scenario.load
        if load.duration_s is not None:
            return load.warmup_s + load.duration_s + drain_timeout_s
        return None

    def class_of(self, name: str) -> RequestClass:
        return next(c for c in self._classes if c.name == name)


def build_plan(scenario: Scenario) -> Plan:
    return Plan(scenario)
