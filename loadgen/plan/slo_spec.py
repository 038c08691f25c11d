"""``slo:``: the objectives a run is judged by (limits on percentiles, stalls, fluidity, errors, goodput)."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


PERCENTILE_KEYS = ("p50", "p90", "p95", "p99", "p999", "max", "mean")


class Thresholds(_Strict):
    """Upper limits (ms) on statistics of one metric."""

    p50: float | None = Field(None, gt=0)
    p90: float | None = Field(None, gt=0)
    p95: float | None = Field(None, gt=0)
    p99: float | None = Field(None, gt=0)
    p999: float | None = Field(None, gt=0)
    max: float | None = Field(None, gt=0)
    mean: float | None = Field(None, gt=0)

    def items(self) -> list[tuple[str, float]]:
        return [(k, v) for k in PERCENTILE_KEYS if (v := getattr(self, k)) is not None]


class TtftBucket(Thresholds):
    """Percentile limits for requests whose prompt is at most ``max_prompt_tokens`` (above the previous bucket)."""

    max_prompt_tokens: int = Field(ge=1)


class TtftThresholds(Thresholds):
    """TTFT limits; long prompts can be judged fairly by a per-request limit ``base + per_prompt_token × P``
    (at most ``max_violation_ratio`` of requests may exceed theirs) or by prompt-length ``buckets``."""

    base: float | None = Field(None, ge=0, description="ms allowed to any request")
    per_prompt_token: float | None = Field(None, ge=0, description="ms allowed per prompt token")
    max_violation_ratio: float = Field(0.01, ge=0, le=1)
    buckets: list[TtftBucket] | None = None

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
    max_per_request: float | None = Field(None, gt=0, description="p99 over requests of each one's worst gap (ms)")


class StallSlo(_Strict):
    """How stalls are found (DESIGN §5) and the limits on them."""

    spike_factor: float = Field(4.0, gt=1, description="a stall is a gap above spike_factor × baseline ITL ...")
    min_gap_ms: float | None = Field(None, ge=0, description="... and above this (default: the itl_ms p99 limit)")
    long_prompt_tokens: int | None = Field(None, ge=1, description="culprit prompts (default: the run's p90)")
    overlap_share: float = Field(0.5, gt=0, le=1, description="a prefill window must cover this much of a gap")
    group_ms: float = Field(5.0, gt=0, description="stalls ending this close are one spike event")
    max_per_1k_tokens: float | None = Field(None, ge=0)
    max_prefill_induced_per_1k_tokens: float | None = Field(None, ge=0)


class FluiditySlo(_Strict):
    target_itl_ms: float = Field(gt=0, description="token i is due at t_first + i × target (Metron)")
    min: float | None = Field(None, ge=0, le=1)


class ErrorRate(_Strict):
    max: float = Field(ge=0, le=1)


class Goodput(_Strict):
    """A request is good when it finished without error within every per-request limit given. ``min_ratio`` is
    DistServe's SLO attainment (the share of requests that must be good); ``slo.attainment`` is another name for
    this block."""

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2e_ms: float | None = Field(None, gt=0)
    min_requests_per_s: float | None = Field(None, ge=0)
    min_ratio: float | None = Field(None, ge=0, le=1, description="least share of requests that must be good")


class Slo(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    ttft_ms: TtftThresholds | None = None
    ttft_service_ms: Thresholds | None = None
    itl_ms: ItlThresholds | None = None
    chunk_gap_ms: Thresholds | None = None
    tpot_ms: Thresholds | None = None
    e2e_ms: Thresholds | None = None
    error_rate: ErrorRate | None = None
    goodput: Goodput | None = Field(None, validation_alias=AliasChoices("goodput", "attainment"))
    stalls: StallSlo = Field(default_factory=StallSlo, validation_alias=AliasChoices("stalls", "spikes"))
    fluidity: FluiditySlo | None = None
    max_generator_lag_ms: float = Field(10.0, gt=0, description="p99 queue_delay_ms above this: inconclusive")
