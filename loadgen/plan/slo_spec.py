"""``slo:``: the objectives a run is judged by (limits on percentiles, stalls, fluidity, errors, goodput)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from loadgen.core.vocabulary import LIMIT_STATS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


PERCENTILE_KEYS = LIMIT_STATS  # what a threshold may limit (core/vocabulary.py)


class Thresholds(_Strict):
    """Upper limits (ms) on statistics of one metric."""

    p50: float | None = Field(None, gt=0, description="ms: upper limit on the median (unset: not judged)")
    p90: float | None = Field(None, gt=0, description="ms: upper limit on the 90th percentile (unset: not judged)")
    p95: float | None = Field(None, gt=0, description="ms: upper limit on the 95th percentile (unset: not judged)")
    p99: float | None = Field(None, gt=0, description="ms: upper limit on the 99th percentile (unset: not judged)")
    p999: float | None = Field(None, gt=0, description="ms: upper limit on the 99.9th percentile (unset: not "
                               "judged)")
    max: float | None = Field(None, gt=0, description="ms: upper limit on the largest value (unset: not judged)")
    mean: float | None = Field(None, gt=0, description="ms: upper limit on the mean (unset: not judged)")

    def items(self) -> list[tuple[str, float]]:
        return [(k, v) for k in PERCENTILE_KEYS if (v := getattr(self, k)) is not None]


class TtftBucket(Thresholds):
    """Percentile limits for requests whose prompt is at most ``max_prompt_tokens`` (above the previous bucket)."""

    max_prompt_tokens: int = Field(ge=1, description="tokens: this bucket holds the requests whose prompt is at "
                                   "most this long (and longer than the previous bucket's)")


class TtftThresholds(Thresholds):
    """TTFT limits; long prompts can be judged fairly by a per-request limit ``base + per_prompt_token × P``
    (at most ``max_violation_ratio`` of requests may exceed theirs) or by prompt-length ``buckets``."""

    base: float | None = Field(None, ge=0, description="ms allowed to any request (give with per_prompt_token)")
    per_prompt_token: float | None = Field(None, ge=0, description="ms allowed per prompt token, on top of base")
    max_violation_ratio: float = Field(0.01, ge=0, le=1, description="the largest share of requests whose TTFT "
                                       "may exceed base + per_prompt_token × their prompt tokens")
    buckets: list[TtftBucket] | None = Field(None, description="limits per prompt-length bucket, in increasing "
                                             "max_prompt_tokens")

    @model_validator(mode="after")
    def _pair(self) -> "TtftThresholds":
        if (self.base is None) != (self.per_prompt_token is None):
            raise ValueError("give base and per_prompt_token together")
        if self.buckets:
            edges = [b.max_prompt_tokens for b in self.buckets]
            if edges != sorted(set(edges)):
                raise ValueError(f"bucket max_prompt_tokens must increase: {edges}")
        return self


class ItlThresholds(Thresholds):
    max_per_request: float | None = Field(None, gt=0, description="ms: upper limit on the p99 over requests of "
                                            "each one's worst chunk gap")


class StallSlo(_Strict):
    """How stalls are found (DESIGN §5) and the limits on them."""

    spike_factor: float = Field(4.0, gt=1, description="a stall is a chunk gap above spike_factor × the "
                                "class's median ITL (and above min_gap_ms)")
    min_gap_ms: float | None = Field(None, ge=0, description="ms: a stall's gap is also above this (default: "
                                      "the itl_ms p99 limit)")
    long_prompt_tokens: int | None = Field(None, ge=1, description="tokens: prompts at least this long can be a "
                                             "stall's culprit (default: the run's p90 prompt length)")
    overlap_share: float = Field(0.5, gt=0, le=1, description="the share of a gap that culprits' prefill "
                                 "windows must cover for the stall to be prefill-induced")
    group_ms: float = Field(5.0, gt=0, description="ms: stalls ending this close together are one spike "
                            "event")
    max_per_1k_tokens: float | None = Field(None, ge=0, description="upper limit on stalls per 1,000 output "
                                            "tokens (unset: not judged)")
    max_prefill_induced_per_1k_tokens: float | None = Field(None, ge=0, description="upper limit on stalls a "
                                                            "long prefill caused, per 1,000 output tokens")


class FluiditySlo(_Strict):
    target_itl_ms: float = Field(gt=0, description="token i is due at t_first + i × target (Metron)")
    min: float | None = Field(None, ge=0, le=1, description="least fluidity index: the share of tokens on "
                              "schedule (unset: reported, not judged)")


class ErrorRate(_Strict):
    max: float = Field(ge=0, le=1, description="the largest share of measured requests that may fail (0: none)")


class Goodput(_Strict):
    """A request is good when it finished without error within every per-request limit given. ``min_ratio`` is
    DistServe's SLO attainment (the share of requests that must be good); ``slo.attainment`` is another name for
    this block."""

    ttft_ms: float | None = Field(None, gt=0, description="ms: a good request's time to first token, at most")
    tpot_ms: float | None = Field(None, gt=0, description="ms: a good request's time per output token, at most")
    e2e_ms: float | None = Field(None, gt=0, description="ms: a good request's end-to-end latency, at most")
    min_requests_per_s: float | None = Field(None, ge=0, description="least good requests per second of "
                                             "measured time")
    min_ratio: float | None = Field(None, ge=0, le=1, description="least share of requests that must be good")


class SessionGood(_Strict):
    """What makes an agentic session good: every call succeeded, and within each limit given."""

    session_ms: float | None = Field(None, gt=0, description="ms: a good session's latency (its first call's "
                                     "intended send to its last call's end), at most")
    agent_step_ms: float | None = Field(None, gt=0, description="ms: a good session's slowest agent step, at most")
    ttft_answer_ms: float | None = Field(None, gt=0, description="ms: a good session's slowest time to first "
                                         "answer token over its calls, at most")


class SessionSlo(_Strict):
    """Job-level objectives over agentic sessions (issue 38): the share of good sessions and the completed
    sessions per hour, each decided on an interval whose samples are sessions."""

    good: SessionGood = Field(default_factory=SessionGood, description="the limits a good session meets")
    min_attainment: float | None = Field(None, ge=0, le=1, description="least share of sessions that must be "
                                         "good (per-session SLO attainment)")
    min_jobs_per_hour: float | None = Field(None, ge=0, description="least sessions completed with every call "
                                            "successful, per hour of measured time")


class Slo(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    ttft_ms: TtftThresholds | None = Field(None, description="time to first token from the intended send time "
                                           "(queueing included): limits by percentile or prompt length")
    ttft_service_ms: Thresholds | None = Field(None, description="time to first token from the actual send "
                                               "(the server's share): percentile limits")
    itl_ms: ItlThresholds | None = Field(None, description="inter-token latency, one sample per token: "
                                         "percentile limits and each request's worst gap")
    chunk_gap_ms: Thresholds | None = Field(None, description="gaps between consecutive streamed chunks: "
                                            "percentile limits")
    tpot_ms: Thresholds | None = Field(None, description="time per output token after the first: percentile "
                                       "limits")
    e2e_ms: Thresholds | None = Field(None, description="intended send time to last byte: percentile limits")
    ttft_answer_ms: Thresholds | None = Field(None, description="time to first answer token (not reasoning) from "
                                              "the intended send time: percentile limits")
    tpot_answer_ms: Thresholds | None = Field(None, description="time per answer token after the first answer "
                                              "token: percentile limits")
    itl_answer_ms: Thresholds | None = Field(None, description="inter-token latency of the answer phase, one "
                                             "sample per token: percentile limits")
    session_ms: Thresholds | None = Field(None, description="an agentic session's latency, one sample per "
                                          "session: percentile limits")
    agent_step_ms: Thresholds | None = Field(None, description="an agent step's latency (to its result, or its "
                                             "sub-agents' join), one sample per step: percentile limits")
    sessions: SessionSlo | None = Field(None, description="job-level objectives over sessions: attainment and "
                                        "jobs per hour")
    error_rate: ErrorRate | None = Field(None, description="the share of failed requests (unset: max 0, any "
                                         "failure fails the run)")
    goodput: Goodput | None = Field(None, validation_alias=AliasChoices("goodput", "attainment"),
                                    description="per-request limits that make a request good, and the least "
                                    "goodput (also accepted as attainment)")
    stalls: StallSlo = Field(default_factory=StallSlo, validation_alias=AliasChoices("stalls", "spikes"),
                             description="how stalls are found and the limits on them (also accepted as spikes)")
    fluidity: FluiditySlo | None = Field(None, description="Metron's fluidity index: tokens due on a schedule "
                                         "(unset: not computed)")
    decision: Literal["interval", "point"] = Field("interval", description="interval: an objective PASSes "
                                                  "or FAILs only when its confidence interval is wholly on "
                                                  "one side of the limit, else the run is INCONCLUSIVE with "
                                                  "the samples needed (docs/verdicts.md); point: the "
                                                  "observed value alone decides — flaky by design near a "
                                                  "limit")
    confidence: float = Field(0.95, ge=0.5, lt=1, description="confidence level of every objective's "
                              "interval (two-sided)")
    max_generator_lag_ms: float = Field(10.0, gt=0, description="ms: a p99 client_lag_ms (loadgen's own "
                                         "lateness: the queue delay less any wait for a slot of a full "
                                         "load.max_in_flight) above this makes the run inconclusive (the "
                                         "generator lagged)")
    max_generator_cpu: float = Field(0.95, gt=0, le=64, description="share of one core: a sending process whose "
                                     "CPU over the run reaches this makes the run inconclusive (the generator was "
                                     "CPU-bound; docs/verdicts.md)")
