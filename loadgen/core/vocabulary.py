"""loadgen's vocabulary, declared once: the metrics (unit, what one sample is, whether an SLO may limit it, which
way is better, their family: latency always; reasoning and session in a run that has them), the run-level
figures (``FIGURES``: one value per run, not a distribution), the statistics every metric table carries, the
causes (of a request's miss, of a stall), and an objective's identity as ``(metric, stat)`` rather than a string
built in one module and parsed in others.

The scenario's SLO fields (``plan/slo_spec.py``), the summary's metric tables (``analysis/metrics.py``), the SLO
objectives (``analysis/slo.py``), the report's rows (``report/writers.py``), compare's and the capacity
search's statistics (``analysis/compare.py``, ``analysis/capacity.py``), the stall analysis
(``analysis/spikes.py``) and the SLO-miss ledger (``analysis/ledger.py``) take their names from here;
``tests/test_vocabulary.py`` holds each of them to it. Standard library only, like the rest of the core.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

STATS = ("count", "mean", "p50", "p90", "p95", "p99", "p999", "max")  # every metric table's columns, in order
QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p999": 0.999}  # the percentile statistics
LIMIT_STATS = ("p50", "p90", "p95", "p99", "p999", "max", "mean")  # what an SLO's thresholds may limit


Family = Literal["latency", "reasoning", "session"]


@dataclass(frozen=True)
class Metric:
    """One metric of the summary's metric table. A family's rows appear only in a run that has it
    (``reasoning``: some request reasoned; ``session``: some request was an agentic session's call)."""

    name: str
    unit: str  # "ms" or "tokens"
    basis: Literal["request", "token", "session", "step"]  # what one sample is: a request, an output token (or
    # chunk), a session, an agent's step
    slo: bool  # the scenario's ``slo`` may limit its statistics
    comparable: bool  # ``compare`` and the capacity search can bootstrap its percentiles
    description: str
    family: Family = "latency"


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("ttft_ms", "ms", "request", True, True, "time to first token from the intended send time: the first "
           "generated token of any kind (reasoning, tool call or answer), as MLPerf LoadGen counts a reasoning "
           "fragment as the first token; ttft_answer_ms is the first answer token"),
    Metric("ttft_service_ms", "ms", "request", True, False, "time to first token from the actual send, so the "
           "queue delay (queue_delay_ms) is left out; ttft_ms counts from the intended send"),
    Metric("itl_ms", "ms", "token", True, True, "inter-token latency, one sample per token"),
    Metric("chunk_gap_ms", "ms", "token", True, False, "gap between consecutive streamed chunks, one sample per "
           "chunk (a chunk may carry several tokens); itl_ms spreads each gap over the chunk's tokens"),
    Metric("tpot_ms", "ms", "request", True, True, "time per output token after the first"),
    Metric("e2e_ms", "ms", "request", True, True, "intended send time to the last byte"),
    Metric("queue_delay_ms", "ms", "request", False, False, "sent minus intended: the client's own lateness "
           "and any wait for a slot of a full load.max_in_flight the server held (the lag rule judges the first "
           "alone, client_lag_ms: docs/verdicts.md)"),
    # reasoning (issue 38): phases split at each request's first answer chunk (t_first_answer_ns)
    Metric("ttft_answer_ms", "ms", "request", True, True, "time to first answer token (answer text or tool call, "
           "not reasoning) from the intended send time", "reasoning"),
    Metric("reasoning_ms", "ms", "request", False, False, "time spent reasoning before the answer: first answer "
           "chunk minus first token (requests that reasoned)", "reasoning"),
    Metric("tpot_reasoning_ms", "ms", "request", False, True, "time per reasoning token after the first: (last "
           "reasoning chunk − first token) / (reasoning tokens − 1)", "reasoning"),
    Metric("tpot_answer_ms", "ms", "request", True, True, "time per answer token after the first: (last token − "
           "first answer chunk) / (answer tokens − 1)", "reasoning"),
    Metric("itl_reasoning_ms", "ms", "token", False, False, "inter-token latency of chunks before the first answer "
           "chunk, one sample per token", "reasoning"),
    Metric("itl_answer_ms", "ms", "token", True, False, "inter-token latency of chunks after the first answer "
           "chunk (the gap ending at it is in neither phase), one sample per token", "reasoning"),
    Metric("reasoning_tokens", "tokens", "request", False, False, "output tokens that were reasoning, per request",
           "reasoning"),
    Metric("answer_tokens", "tokens", "request", False, False, "output tokens less reasoning tokens (tool calls "
           "are answer), per request", "reasoning"),
    # agentic sessions (issue 38)
    Metric("session_ms", "ms", "session", True, True, "a session's latency: its last call's end minus its first "
           "root call's intended send (sessions whose calls all succeeded)", "session"),
    Metric("agent_step_ms", "ms", "step", True, False, "an agent's step: intended send to its result being "
                                                       "usable (its end; for a step that spawned sub-agents, "
                                                       "when the join was ready)", "session"),
)}
FAMILIES: tuple[Family, ...] = ("latency", "reasoning", "session")
REQUEST_METRICS = tuple(name for name, m in METRICS.items() if m.basis == "request")
TOKEN_METRICS = tuple(name for name, m in METRICS.items() if m.basis == "token")
SESSION_METRICS = tuple(name for name, m in METRICS.items() if m.basis in ("session", "step"))
SLO_METRICS = tuple(name for name, m in METRICS.items() if m.slo)
COMPARABLE_METRICS = tuple(name for name, m in METRICS.items() if m.comparable)


def family_metrics(*families: str) -> tuple[str, ...]:
    """The metrics of these families, in the vocabulary's order."""
    return tuple(name for name, m in METRICS.items() if m.family in families)


def metric_rows(table: Mapping[str, Any]) -> tuple[str, ...]:
    """The rows a metric table (summary.json's ``metrics``) has, in the vocabulary's order."""
    return tuple(name for name in METRICS if name in table)


@dataclass(frozen=True)
class Figure:
    """A run-level figure (one value per run or class, not a distribution) and where summary.json holds it."""

    name: str
    unit: str
    description: str
    where: str  # its key path in summary.json


FIGURES: dict[str, Figure] = {f.name: f for f in (
    Figure("reasoning_share", "share", "reasoning tokens over output tokens (successful measured requests)",
           "reasoning.reasoning_share"),
    Figure("jobs_per_hour", "per_h", "sessions completed with every call successful, per hour of the measured "
           "window", "sessions.jobs_per_hour"),
    Figure("session_attainment", "share", "share of sessions that were good by slo.sessions.good (every call "
           "successful within its limits)", "sessions.attainment"),
    Figure("session_cache_hit_ratio", "share", "per session: cached prompt tokens over prompt tokens "
           "(distribution over sessions)", "sessions.cache_hit_ratio"),
    Figure("tool_calls_missing", "calls", "tool-turn calls the server answered with text instead of a tool call",
           "sessions.tool_calls_missing"),
)}
# The figures people quote (issue 40): throughput in all, cost, energy, MLPerf Endpoints conventions. Their
# summary.json sections are written by analysis/figures (engineer F); they join FIGURES once typed there.
QUOTED_FIGURES: dict[str, Figure] = {f.name: f for f in (
    Figure("total_tokens_per_s", "tokens_per_s", "prompt plus output tokens of the measured requests per second "
           "of the measured window", "throughput.total_tokens_per_s"),
    Figure("cost_per_1m_output_tokens", "currency", "the deployment's declared price per hour (cost.price_per_hour)"
           " × measured hours / output tokens × 1e6", "figures.cost_per_1m_output_tokens"),
    Figure("cost_per_1m_total_tokens", "currency", "the declared price per hour × measured hours / (prompt + output "
           "tokens) × 1e6", "figures.cost_per_1m_total_tokens"),
    Figure("energy_j_per_output_token", "J", "the GPUs' energy over the measured window (DCGM energy counter's "
           "delta, else the integral of power) / output tokens; on a shared node it includes other tenants' work",
           "figures.energy_j_per_output_token"),
    Figure("energy_j_per_total_token", "J", "the GPUs' energy over the measured window / (prompt + output tokens)",
           "figures.energy_j_per_total_token"),
    Figure("energy_j", "J", "the GPUs' energy over the measured window (DCGM counter's delta, else the integral of "
           "power over time), summed over GPUs and target.power_metrics URLs", "figures.energy_j"),
    Figure("power_w_mean", "W", "the GPUs' mean power over the measured window, summed over GPUs and URLs "
           "(target.power_metrics)", "figures.power_w_mean"),
    Figure("ttft_p90_ms", "ms", "TTFT p90, the MLPerf Endpoints convention's latency figure", "mlperf.ttft_p90_ms"),
    Figure("tpot_p90_ms", "ms", "TPOT p90, the MLPerf Endpoints convention's decode figure", "mlperf.tpot_p90_ms"),
    Figure("tokens_per_s_per_user", "tokens_per_s", "1000 / tpot_p90_ms: the output tokens per second one user "
           "sees (MLPerf Endpoints)", "mlperf.tokens_per_s_per_user"),
    Figure("lift", "ratio", "stalls per output token while a long prompt was prefilling over stalls per token "
           "elsewhere: ×1 means long prefills change nothing, ×10 that they make stalls ten times likelier",
           "stalls.lift"),
    Figure("goodput", "per_s", "completed requests per second that met every limit of slo.goodput; equal to the "
           "completed rate when slo.goodput is not declared", "throughput.goodput_requests_per_s"),
)}
# What the objectives that are not on one metric judge (slo.error_rate, slo.stalls, slo.fluidity, slo.sessions).
OBJECTIVE_FAMILIES: dict[str, str] = {
    "error_rate": "failed requests (HTTP errors, in-band errors, timeouts) over the measured requests",
    "stalls": "a stall is a gap between two chunks of one stream far beyond the stream's usual pace; its rates "
              "are per 1,000 output tokens, so an objective's samples are output tokens (docs/causes.md)",
    "fluidity": "Metron's fluidity index: the share of output tokens after the first that met a deadline "
                "schedule of one token per target ITL",
    "sessions": "agentic sessions as jobs: the share good by slo.sessions.good, and jobs per hour",
}
# The rows that look alike in every table, and where to read the rest (console, summary.md, report.html).
LOOK_ALIKE = (("ttft_service_ms", "from the actual send", "ttft_ms", "from the intended send"),
              ("chunk_gap_ms", "per chunk", "itl_ms", "per token"))
LEGEND = " · ".join(f"{a}: {wa} ({b}: {wb})" for a, wa, b, wb in LOOK_ALIKE) + " · loadgen explain NAME"


# Why a request missed its limits (analysis/ledger.py) or a stall happened (analysis/spikes.py), one registry in
# the ledger's decision order (docs/causes.md): a stall's cause and a request's cause read the same. ``unknown``
# is the "unexplained": the evidence does not decide, and the ledger never guesses.
CAUSES: dict[str, str] = {
    "server_error": "the request failed at the server: an HTTP error status (429, 5xx, 4xx), an in-band error or "
                    "a timeout",
    "network": "the transport: a connect error, or the connect and TLS handshake time, or response headers late "
               "beyond the run's usual",
    "client_lag": "a send due during the gap left more than half the gap late, not held by the in-flight cap, or "
                  "loadgen's event loop was blocked while it should have read: loadgen itself was late",
    "preemption": "the server's /metrics counted a preemption then, or its KV cache was full (>= 0.95) while the "
                  "request waited (overrides the other stall causes)",
    "prefill": "long prompts' prefill windows (the culprits) cover the gap: prefill-induced",
    "prefill_burst": "three or more requests got their first token as the gap ended: a batch of prefills admitted "
                     "together, none long enough to be a culprit alone",
    "burst": "sends during the gap ran at four times the run's mean rate or more (three sends at least)",
    "queueing": "the request waited at the server beyond its own prefill (admission wait)",
    "own_prompt": "its own work: its own prefill alone (TTFT), or its own prefill and decode at the run's usual "
                  "pace (E2E), exceeds the limit; or it spent its own max_tokens reasoning and never answered "
                  "(ttft_answer_ms)",
    "load": "the server's batch was slow: every decode step of the request (a large running batch), no single "
            "stall; or a gap in which most streams paused, with no culprit, burst or preemption",
    "unknown": "nothing loadgen can see coincides with the gap; for a request's miss, the evidence does not decide: "
               "unexplained (never a guess)",
}
# Why a stall happened (analysis/spikes.py's attribution), in the order the report lists them: the stall subset
# of CAUSES, with the same meanings.
STALL_ORDER = ("prefill", "prefill_burst", "burst", "preemption", "client_lag", "unknown")
STALL_CAUSES: dict[str, str] = {name: CAUSES[name] for name in STALL_ORDER}


@dataclass(frozen=True, order=True)
class ObjectiveId:
    """An SLO objective's identity: a metric (or a family such as ``error_rate``, ``stalls``, ``goodput``) and
    the statistic or limit of it that is judged. ``str()`` is the name summary.json and the console show."""

    metric: str
    stat: str
    scope: str = ""  # a subset of the requests it judges, e.g. "1-512 prompt tokens" (TTFT by prompt length)

    def __str__(self) -> str:
        return f"{self.metric}[{self.scope}].{self.stat}" if self.scope else f"{self.metric}.{self.stat}"

    @classmethod
    def parse(cls, name: str) -> ObjectiveId:
        """The identity of a name as ``str()`` writes it (a ``--metric`` flag; summary.json files written before
        objectives carried their parts): the statistic follows the last dot, a scope sits in brackets."""
        head, dot, stat = name.rpartition(".")
        scoped = re.fullmatch(r"([^\[\]]+)\[([^\[\]]+)\]", head)
        metric, scope = (scoped.group(1), scoped.group(2)) if scoped else (head, "")
        if not dot or not metric or not stat or "[" in metric or "]" in metric:
            raise ValueError(f"{name!r}: not an objective name (metric.stat)")
        return cls(metric, stat, scope)

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> ObjectiveId:
        """The identity of an objective as summary.json holds it (parsed from its name in older files)."""
        if isinstance(result.get("metric"), str) and isinstance(result.get("stat"), str):
            return cls(result["metric"], result["stat"], str(result.get("scope") or ""))
        return cls.parse(str(result["objective"]))

    @property
    def bootstrappable(self) -> bool:
        """A percentile of a metric over every measured request, which ``compare`` and the capacity search
        can bootstrap from the records."""
        return self.metric in COMPARABLE_METRICS and self.stat in QUANTILES and not self.scope


def definition(name: str) -> str | None:
    """The definition of a metric, objective, cause or figure by name (``loadgen explain``); None: unknown."""
    if name in METRICS:
        m = METRICS[name]
        per = "" if "one sample per" in m.description else f", one sample per {m.basis}"
        return f"{name} ({m.unit}{per}): {m.description}"
    if name in OBJECTIVE_FAMILIES:
        return f"{name} (objectives on it: {name}.STAT): {OBJECTIVE_FAMILIES[name]}"
    figure = FIGURES.get(name) or QUOTED_FIGURES.get(name)
    if figure is not None:
        return f"{name} ({figure.unit}; summary.json {figure.where}): {figure.description}"
    if name in CAUSES:
        return f"{name} (cause): {CAUSES[name]}"
    try:
        objective = ObjectiveId.parse(name)
    except ValueError:
        return None
    base = definition(objective.metric)
    return None if base is None else f"{name}: the {objective.stat} of {base}"


def names() -> dict[str, tuple[str, ...]]:
    """Every name ``definition`` knows, by kind."""
    return {"metrics": tuple(METRICS), "objectives on": tuple(OBJECTIVE_FAMILIES),
            "figures": tuple(FIGURES) + tuple(QUOTED_FIGURES), "causes": tuple(CAUSES)}

