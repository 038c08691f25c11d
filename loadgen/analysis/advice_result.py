"""``loadgen advise``'s outcome, typed: the fitted cost model and how well its replay of the run matches the
measurement, every candidate setting's predicted figures and objectives, the recommendation and what it costs,
and the exit code. ``advice.json`` is ``to_dict``.

Exit codes: 0 when a candidate is predicted to meet every objective the replay judges (``covers``) with the
margin asked, in at least 95 % of its replays (the recommendation; it may be the current setting), 1 when none
is (``closest`` then names the one nearest to it), 2 for bad input (before any replay). The objectives the
replay cannot move (``on_run``: the measured run's own judgment of them) never decide it. The headroom rule:
``loadgen/advise/headroom.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from loadgen.analysis.result import RunResult

SCHEMA_VERSION = 3  # 2: each candidate's headroom over seeded replays; margin, seeds, closest. 3: covers, on_run,
# headroom.stopped
# (label, metric, statistic) of the figures compared between the measured run and its replay
FIGURES = (("TTFT p50", "ttft_ms", "p50"), ("TTFT p99", "ttft_ms", "p99"), ("ITL p50", "itl_ms", "p50"),
           ("ITL p99", "itl_ms", "p99"), ("ITL p99.9", "itl_ms", "p999"), ("worst gap", "chunk_gap_ms", "max"))
STALL_FIGURE = "prefill-induced stalls per 1k tokens"


@dataclass
class FitRow:
    figure: str
    measured: Optional[float]
    predicted: Optional[float]

    @property
    def error(self) -> Optional[float]:
        """(predicted − measured) / measured; None where the measurement is 0 or missing."""
        if self.measured in (None, 0) or self.predicted is None:
            return None
        return (self.predicted - self.measured) / self.measured  # type: ignore[operator]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error": self.error}


def figures_of(r: RunResult) -> dict[str, Optional[float]]:
    """The figures compared (FIGURES, then the prefill-induced stall rate) of one run or replay."""
    out: dict[str, Optional[float]] = {label: (r.metrics.get(m) or {}).get(stat)  # type: ignore[misc]
                                       for label, m, stat in FIGURES}
    out[STALL_FIGURE] = (r.stalls or {}).get("prefill_induced_per_1k_tokens")
    return out


def fit_rows(measured: RunResult, predicted: RunResult) -> list[FitRow]:
    m, p = figures_of(measured), figures_of(predicted)
    return [FitRow(k, m[k], p[k]) for k in m]


def meets_point(o: dict[str, Any]) -> bool:
    """The objective's value is on the passing side of its limit (point verdict; no value: not met)."""
    value, limit = o.get("value"), o.get("threshold")
    if value is None or limit is None:
        return o.get("passed") is True
    return bool(value >= limit if o.get("comparison", "<=") == ">=" else value <= limit)


@dataclass
class ObjectiveHeadroom:
    """One objective's margins over a candidate's replays, as shares of its limit (positive: room)."""

    objective: str
    comparison: str
    limit: float
    kept: Optional[float]  # the margin kept in 95 % of the replays (None: no relative margin, a 0 limit)
    worst: Optional[float]  # the smallest margin of any replay
    short: int  # replays in which it did not keep the margin (or did not pass)
    undecided: int  # replays in which it was not decided pass (its interval reached the limit, or failed)
    samples: Optional[int] = None  # what the statistic was computed over in a replay (requests, tokens)
    needed: Optional[int] = None  # the most samples any undecided replay needed to decide it (the verdict's)


@dataclass
class Headroom:
    """A candidate's seeded replays judged with the margin (``loadgen/advise/headroom.py``)."""

    margin: float
    seeds: int  # replays asked
    replays: int  # replays run (fewer: stopped once it could no longer qualify)
    held: int  # replays in which every objective kept the margin and passed
    required: int  # replays that must hold (95 % of seeds)
    objectives: list[ObjectiveHeadroom]
    stopped: str = "all_replays"  # "all_replays": every one asked was run; "cannot_qualify": stopped once more
    # replays had failed than the rule allows (seeds − required)

    @property
    def allowed(self) -> int:
        """Replays that may fail to hold."""
        return self.seeds - self.required

    @property
    def qualifies(self) -> bool:
        return self.held >= self.required

    @property
    def least(self) -> Optional[ObjectiveHeadroom]:
        """The objective with the smallest margin kept (the one that limits the candidate)."""
        with_margin = [o for o in self.objectives if o.kept is not None]
        return min(with_margin, key=lambda o: o.kept or 0.0) if with_margin else None

    @property
    def failing(self) -> list[ObjectiveHeadroom]:
        """The objectives short (of the margin, or of a pass) in more replays than the rule allows."""
        return [o for o in self.objectives if o.short > self.seeds - self.required]

    @property
    def deficit(self) -> float:
        """The margins missing, summed over the objectives, each at most 1 (a whole limit): how far the candidate
        is from qualifying."""
        return sum(min(1.0, max(0.0, self.margin - o.kept)) for o in self.objectives if o.kept is not None)

    @property
    def shortfall(self) -> float:
        """How far the least margin kept is below the margin asked (0: none short of it)."""
        least = self.least
        return max(0.0, self.margin - least.kept) if least is not None and least.kept is not None else 0.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Headroom":
        return cls(**{**d, "objectives": [ObjectiveHeadroom(**o) for o in d["objectives"]]})


@dataclass
class CandidateResult:
    label: str
    settings: dict[str, Any]
    flags: list[str]
    verdict: str
    objectives: list[dict[str, Any]]
    figures: dict[str, Optional[float]]
    goodput_requests_per_s: Optional[float]
    ttft_p99_by_class_ms: dict[str, Optional[float]]
    capacity_requests_per_s: Optional[float] = None  # --capacity: the highest rate meeting every objective
    capacity_note: str = ""  # "", or why there is no figure / it is a bound ("at least", "below")
    headroom: Optional[Headroom] = None  # the seeded replays judged with the margin

    @property
    def meets_all(self) -> bool:
        """The replay under the scenario's seed meets every objective on its point value (no margin, no
        interval: ``headroom`` has those)."""
        return bool(self.objectives) and all(meets_point(o) for o in self.objectives)

    @property
    def qualifies(self) -> bool:
        """Meets every objective with the margin in 95 % of its replays (``meets_all`` without a headroom)."""
        return self.headroom.qualifies if self.headroom is not None else self.meets_all

    @property
    def failed(self) -> list[str]:
        return [o["objective"] for o in self.objectives if not meets_point(o)]

    @classmethod
    def from_result(cls, label: str, settings: dict[str, Any], flags: list[str], r: RunResult) -> "CandidateResult":
        by_class = {name: ((c.get("metrics") or {}).get("ttft_ms") or {}).get("p99")
                    for name, c in (r.classes or {}).items()}
        return cls(label, settings, flags, r.verdict, [dict(o) for o in r.slo], figures_of(r),
                   (r.throughput or {}).get("goodput_requests_per_s"), by_class)


@dataclass
class Advice:
    run_dir: str
    engine: str
    settings_source: str  # "run.json" (the embedded simulator), "--server", and/or "<engine>'s defaults for …"
    current: dict[str, Any]
    calibration: dict[str, Any]
    fit: list[FitRow]
    candidates: list[CandidateResult]
    recommended: Optional[int]  # index into candidates
    costs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    margin: float = 0.0  # the margin asked, a share of each limit
    seeds: int = 1  # replays per candidate
    closest: Optional[int] = None  # when none qualifies: the candidate nearest to the margin
    covers: list[str] = field(default_factory=list)  # the objectives the replays judge (the recommendation's)
    # the objectives the replay cannot move, as the measured run judged them: objective, comparison, threshold,
    # value, decision, samples, needed, note, and why (what the replay does not model)
    on_run: list[dict[str, Any]] = field(default_factory=list)

    @property
    def recommendation(self) -> Optional[CandidateResult]:
        return None if self.recommended is None else self.candidates[self.recommended]

    @property
    def exit_code(self) -> int:
        return 0 if self.recommended is not None else 1

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "run_dir": self.run_dir, "engine": self.engine,
                "settings_source": self.settings_source, "current": self.current, "calibration": self.calibration,
                "fit": [r.as_dict() for r in self.fit],
                "candidates": [{**asdict(c), "meets_all": c.meets_all} for c in self.candidates],
                "recommended": self.recommended,
                "recommendation": None if self.recommendation is None else self.recommendation.label,
                "costs": self.costs, "notes": self.notes, "margin": self.margin, "seeds": self.seeds,
                "closest": self.closest, "covers": self.covers, "on_run": self.on_run, "exit_code": self.exit_code}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Advice":
        fit = [FitRow(r["figure"], r["measured"], r["predicted"]) for r in d["fit"]]
        cands = [CandidateResult(**{k: v for k, v in c.items() if k not in ("meets_all", "headroom")},
                                 headroom=Headroom.from_dict(c["headroom"]) if c.get("headroom") else None)
                 for c in d["candidates"]]
        return cls(d["run_dir"], d["engine"], d["settings_source"], d["current"], d["calibration"], fit, cands,
                   d["recommended"], d.get("costs", []), d.get("notes", []), d.get("margin", 0.0),
                   d.get("seeds", 1), d.get("closest"), d.get("covers", []), d.get("on_run", []))


def recommend(cands: list[CandidateResult], goodput_tie: float = 0.01) -> Optional[int]:
    """The candidate that qualifies (every objective with the margin, in 95 % of its replays) with the most
    goodput (its capacity, where ``--capacity`` found them); within ``goodput_tie`` of it, the current setting
    if it is one of them (no change to make), else the lowest TTFT p99. None when no candidate qualifies."""
    ok = [i for i, c in enumerate(cands) if c.qualifies]
    if not ok:
        return None
    by_capacity = any(c.capacity_requests_per_s is not None for c in cands)

    def goodput(i: int) -> float:
        c = cands[i]
        return (c.capacity_requests_per_s if by_capacity else c.goodput_requests_per_s) or 0.0

    best = max(goodput(i) for i in ok)
    near = [i for i in ok if goodput(i) >= best * (1 - goodput_tie)]
    if 0 in near:  # the current setting already does as well: no change to make
        return 0
    return min(near, key=lambda i: (cands[i].figures.get("TTFT p99") or float("inf"), i))


def closest(cands: list[CandidateResult]) -> Optional[int]:
    """When none qualifies: the candidate missing the least margin in all (``Headroom.deficit``), then with the
    fewest objectives short (of the margin or of a pass), then the most replays held, then the first."""
    scored = [(round(c.headroom.deficit, 9), len(c.headroom.failing), -c.headroom.held / c.headroom.replays, i)
              for i, c in enumerate(cands) if c.headroom is not None and c.headroom.replays]
    return min(scored)[-1] if scored else None


def costs_of(chosen: CandidateResult, base: CandidateResult) -> list[str]:
    """What the recommendation changes against the current setting's replay: each class's TTFT p99, the ITL
    p99 and worst gap, and goodput."""
    out = []
    for name, after in chosen.ttft_p99_by_class_ms.items():
        before = base.ttft_p99_by_class_ms.get(name)
        if before and after is not None:
            out.append(f"{name} TTFT p99 {before:,.0f} → {after:,.0f} ms ({(after - before) / before:+.0%})")
    for label in ("ITL p99", "worst gap"):
        before, after = base.figures.get(label), chosen.figures.get(label)
        if before and after is not None:
            out.append(f"{label} {before:,.1f} → {after:,.1f} ms ({(after - before) / before:+.0%})")
    gb, ga = base.goodput_requests_per_s, chosen.goodput_requests_per_s
    if gb and ga is not None:
        out.append(f"goodput {gb:.2f} → {ga:.2f} req/s ({(ga - gb) / gb:+.0%})")
    return out
