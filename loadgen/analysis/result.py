"""``RunResult``: a run's outcome, typed — the verdict and why, per-metric percentiles, SLO results, stall,
generator and server figures, and where the files are. ``summary.json`` is its serialisation (``to_dict``);
``from_dict`` reads one back. Nested blocks are ``TypedDict``s: plain JSON at run time, checked by a type checker.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, NotRequired, Optional, TypedDict

from loadgen.analysis.slo import EXIT_CODES

INTERNAL_EXIT = 4  # loadgen failed on a request: a bug (run/exits.py: INTERNAL)

SCHEMA_VERSION = 1
Verdict = Literal["pass", "fail", "inconclusive"]



class Percentiles(TypedDict):
    count: int
    mean: Optional[float]
    p50: Optional[float]
    p90: Optional[float]
    p95: Optional[float]
    p99: Optional[float]
    p999: Optional[float]
    max: Optional[float]


class RequestCounts(TypedDict, total=False):
    planned: Optional[int]
    sent: int
    warmup: int
    transient: int  # cut as warm-up or drain transients by steady-state detection (analysis/steady.py)
    completed: int
    failed: int
    cancelled: int
    error_rate: float
    errors_by_kind: dict[str, int]


class Throughput(TypedDict, total=False):
    requests_per_s: float
    output_tokens_per_s: float
    goodput_requests_per_s: float
    prompt_tokens_per_s: float  # prompt tokens of the completed requests (embeddings: the throughput)
    total_tokens_per_s: float  # prompt + output
    goodput_declared: bool  # slo.goodput is declared (else goodput counts every completed request)


class SloResult(TypedDict):
    objective: str  # its name, e.g. "ttft_ms.p99", "stalls.max_prefill_induced_per_1k_tokens"
    threshold: float
    value: Optional[float]
    samples: int
    passed: Optional[bool]  # None: inconclusive
    comparison: str
    note: str
    metric: NotRequired[str]  # its identity (core/vocabulary.py's ObjectiveId): "ttft_ms" ...
    stat: NotRequired[str]  # ... "p99"; absent only in summary.json files written before they were
    scope: NotRequired[str]  # the requests it judges when not all, e.g. "1-512 prompt tokens"
    decision: NotRequired[str]  # "pass" | "fail" | "inconclusive" (docs/verdicts.md)
    basis: NotRequired[str]  # "interval" | "observed" | "point": what decided it
    ci_low: NotRequired[Optional[float]]  # its interval (None: unbounded on that side, or none)
    ci_high: NotRequired[Optional[float]]
    confidence: NotRequired[Optional[float]]
    interval: NotRequired[str]  # the interval's method
    margin: NotRequired[Optional[float]]  # room to the limit (positive) or the miss (negative), value's unit
    margin_pct: NotRequired[Optional[float]]  # margin as a percentage of the limit
    needed: NotRequired[Optional[float]]  # samples (tokens for a stall rate) at which it would be decided
    infinite: NotRequired[list[str]]  # the fields above written null because they were +inf (misses counted as +inf)


class StallFigures(TypedDict, total=False):
    count: int
    prefill_induced: int
    per_1k_tokens: float
    prefill_induced_per_1k_tokens: float
    events: int
    lift: Optional[float]
    lift_infinite: bool
    by_cause: dict[str, int]
    worst_gap_ms: Optional[float]
    worst: Optional[dict[str, Any]]  # gap_ms, culprit, culprit_prompt_tokens, cause
    prefill_fit: dict[str, float]
    top_culprits: list[dict[str, Any]]
    worst_events: list[dict[str, Any]]
    events_per_1k_tokens: float  # spike events (one engine step's stalls) per 1k output tokens
    prefill_induced_events_per_1k_tokens: float
    tail_gaps: int  # chunk gaps at or above the run's p99 gap
    tail_prefill_induced_share: Optional[float]  # of those, the share that are prefill-induced stalls
    stalled_ms_per_request: dict[str, float]  # mean, max: excess ms over each request's stalls
    baseline_itl_ms: dict[str, float]  # per class: the median ITL stalls are measured against
    long_prompt_tokens: int  # a culprit's prompt is at least this long
    spike_factor: float
    min_gap_ms: float
    step_tol_ms: float
    fluidity: dict[str, Any]  # Metron's fluidity index (with slo.fluidity): index, tokens, ...
    sensitivity: dict[str, Any]  # band, near_threshold, low_edge, high_edge (counts), dispersion (docs/verdicts.md)


class CauseFigures(TypedDict):
    """One cause's share of the SLO misses (analysis/ledger.py; the causes: core/vocabulary.py CAUSES)."""
    requests: int  # requests whose primary cause it is
    share: float  # of the requests that missed
    goodput_lost: int  # of those, requests not good by the goodput limits
    goodput_lost_per_s: float


class MissFigures(TypedDict):
    """The SLO-miss ledger's figures (summary["misses"]; one row per missed request in misses.parquet)."""
    requests: int  # measured requests that missed a limit
    of: int  # measured requests
    share: float
    limits: dict[str, float]  # per metric: the limit a request is judged against (ms)
    by_cause: dict[str, CauseFigures]  # causes that occurred, most requests first
    unexplained_share: float  # of the misses, the share whose cause is unknown
    top: list[str]  # the leading causes, most requests first


class ClassResult(TypedDict):
    requests: RequestCounts
    metrics: dict[str, Percentiles]
    throughput: Throughput
    stalls: StallFigures
    misses: NotRequired[MissFigures]


class GeneratorFigures(TypedDict, total=False):
    engine: str  # asyncio | locust
    cpu_s: float
    wall_s: float
    cpu_utilization: Optional[float]
    workers: int
    left: list[str]
    processes: int  # sending processes (--workers N)
    max_cpu_utilization: Optional[float]  # the busiest sending process's, of one core (slo.max_generator_cpu)
    per_process: list[dict[str, Any]]  # each sending process's pid, cpu_s, wall_s, cpu_utilization
    master_cpu_s: float  # under --workers (either engine): the coordinating process's own CPU


class ServerFigures(TypedDict, total=False):
    scrapes: int
    running_max: float
    waiting_max: float
    kv_cache_usage_max: float
    preemptions: float
    prefix_cache_hit_rate: float  # prompt tokens found in the server's prefix cache / looked up


class ReasoningCounts(TypedDict):
    """Reasoning counts over measured successful requests (analysis/reasoning.py)."""
    reasoning_share: Optional[float]  # Σ reasoning tokens / Σ output tokens
    reasoning_tokens: int
    answer_tokens: int  # output − reasoning (tool-call tokens are answer)
    tool_tokens: int
    tool_calls: int
    requests_with_reasoning: int
    requests_without_answer: NotRequired[int]  # reasoned, no answer token (e.g. thought until max_tokens): out of
    # the ttft_answer_ms percentiles, a miss for a ttft_answer_ms objective; absent in older summaries
    requests: int


class ReasoningFigures(ReasoningCounts):
    classes: dict[str, ReasoningCounts]


class ToolFigures(TypedDict):
    """Tool calls over measured successful requests (analysis/reasoning.py ``tool_figures``)."""
    requests_with_tool_calls: int
    tool_calls: int
    tool_tokens: int  # also counted in output_tokens


class ToolWaits(TypedDict):
    count: int
    wait_ms: Percentiles


class SessionFigures(TypedDict):
    """Job-level figures over the measured agentic sessions (analysis/sessions.py)."""
    count: int
    completed: int  # every call succeeded
    failed: int
    calls_mean: float
    agents_mean: float
    session_ms: Percentiles  # completed sessions
    agent_step_ms: Percentiles
    jobs_per_hour: Optional[float]
    good: int  # sessions good by slo.sessions.good
    attainment: Optional[float]
    cache_hit_ratio: Percentiles  # per session: cached / prompt tokens
    tool_calls: int
    tool_calls_missing: int
    tool_waits: ToolWaits
    window_s: float
    cut_at_end: int  # sessions the run's end cut short (no call failed): in no other figure


@dataclass
class RunResult:
    verdict: Verdict
    reasons: list[str]
    requests: RequestCounts
    metrics: dict[str, Percentiles]  # core/vocabulary.py's METRICS: the latency family always, the reasoning and
    # session families' rows only in a run that has them (vocabulary.metric_rows)
    throughput: Throughput
    slo: list[SloResult]
    stalls: StallFigures
    stall_headline: str
    classes: dict[str, ClassResult]
    lengths: dict[str, dict[str, Any]]  # prompt/output: asked vs achieved
    window_s: float
    server: ServerFigures
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    model: Optional[str] = None
    generator: GeneratorFigures = field(default_factory=lambda: GeneratorFigures())
    target: dict[str, Any] = field(default_factory=dict)  # base_url (redacted), model, engine, tokenize, simulator
    started_at: Optional[str] = None
    seed: Optional[int] = None
    loadgen_version: Optional[str] = None
    finished: bool = True
    disk_error: Optional[str] = None
    conversations: Optional[dict[str, Any]] = None  # multi-turn: per turn index and per conversation
    reasoning: Optional[ReasoningFigures] = None  # a run where some request reasoned (analysis/reasoning.py)
    sessions: Optional[SessionFigures] = None  # a run of agentic sessions (analysis/sessions.py)
    tools: Optional[ToolFigures] = None  # a run where some request called a tool (analysis/reasoning.py)
    misses: Optional[MissFigures] = None  # the SLO-miss ledger: why requests missed (analysis/ledger.py)
    findings: list[dict[str, Any]] = field(default_factory=list)  # what limits the measurement (run_findings.py)
    decision: dict[str, Any] = field(default_factory=dict)  # rule ("interval" | "point"), confidence
    steady_state: dict[str, Any] = field(default_factory=dict)  # the window measured (analysis/steady.py)
    generator_lag: dict[str, Any] = field(default_factory=dict)  # the lag rule's figures (generator_lag.py)
    figures: dict[str, Any] = field(default_factory=dict)  # cost, energy, power; ``absent``: why (figures.py)
    mlperf: dict[str, Any] = field(default_factory=dict)  # ttft_p90_ms, tpot_p90_ms, tokens_per_s_per_user
    run_dir: Optional[Path] = field(default=None, compare=False)  # not serialised

    @property
    def exit_code(self) -> int:
        """loadgen's exit code for this verdict: 0 pass, 1 fail, 3 inconclusive; 4 when loadgen itself failed
        on a request (``error_kind`` internal: a bug, whatever the verdict)."""
        if (self.requests.get("errors_by_kind") or {}).get("internal"):
            return INTERNAL_EXIT
        return EXIT_CODES[self.verdict]

    @property
    def paths(self) -> dict[str, Path]:
        """The run directory's files that exist: summary.json, report.html, requests.parquet, …"""
        if self.run_dir is None:
            return {}
        names = ("summary.json", "summary.md", "report.html", "junit.xml", "run.json", "requests.parquet",
                 "chunks.parquet", "stalls.parquet", "misses.parquet", "sessions.parquet", "session_steps.parquet",
                 "server_metrics.parquet", "sim_trace.jsonl")
        return {n: self.run_dir / n for n in names if (self.run_dir / n).exists()}

    def slo_result(self, objective: str) -> Optional[SloResult]:
        return next((o for o in self.slo if o["objective"] == objective), None)

    def to_dict(self) -> dict[str, Any]:
        """summary.json: every field but ``run_dir``, then ``schema_version``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "run_dir"}
        return {**out, "schema_version": SCHEMA_VERSION}

    @classmethod
    def from_dict(cls, data: dict[str, Any], run_dir: Optional[Path] = None) -> "RunResult":
        """A summary.json read back (keys a newer loadgen added are ignored; ValueError if one is missing)."""
        missing = [n for n in ("verdict", "reasons", "metrics", "slo", "stalls") if n not in data]
        if missing:
            raise ValueError(f"not a loadgen summary: {', '.join(missing)} missing")
        names = {f.name for f in fields(cls)} - {"run_dir"}
        kwargs: dict[str, Any] = {"stall_headline": "", "requests": {}, "throughput": {}, "classes": {},
                                  "lengths": {}, "window_s": 0.0, "server": {}}
        kwargs.update((k, v) for k, v in data.items() if k in names)
        return cls(**kwargs, run_dir=run_dir)
