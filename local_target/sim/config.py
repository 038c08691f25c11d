"""Engine configuration: the cost model's coefficients, the scheduler's limits, and the presets.

Every duration is in milliseconds of *modelled* engine time; ``time_scale`` multiplies all of them when the
engine runs in real time (0.1 runs ten times faster than the modelled hardware).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class FaultConfig(BaseModel):
    """Faults on demand; everything is off by default."""

    model_config = ConfigDict(extra="forbid")

    error_rate: float = Field(0.0, ge=0, le=1, description="share of requests answered with HTTP 500")
    queue_429_over: int | None = Field(None, ge=0, description="answer 429 when more requests than this are waiting")
    disconnect_rate: float = Field(0.0, ge=0, le=1, description="share of streams cut mid-stream (no [DONE])")
    malformed_rate: float = Field(0.0, ge=0, le=1, description="share of streams that get one malformed chunk")
    stall_ms: float = Field(0.0, ge=0, description="an engine-wide stall of this many ms ...")
    stall_every_s: float = Field(0.0, ge=0, description="... injected into one step this often (0 = never)")
    network_delay_ms: float = Field(0.0, ge=0, description="a slow path in front of the server: requests in "
                                    "network_delay_rate are held this long (real ms, not time_scale'd) before "
                                    "the server reads them, so their response headers come that much later")
    network_delay_rate: float = Field(0.0, ge=0, le=1, description="share of generation requests held "
                                      "network_delay_ms (a seeded draw of their own)")


class EffortMedians(BaseModel):
    """Median reasoning tokens per effort (the lognormal's median; ``minimal`` 0: no reasoning at all)."""

    model_config = ConfigDict(extra="forbid")

    minimal: int = Field(0, ge=0)
    low: int = Field(128, ge=0)
    medium: int = Field(512, ge=0)
    high: int = Field(2048, ge=0)


class ReasoningConfig(BaseModel):
    """How the model reasons (``reasoning.py``): only requests that ask for it reason, unless ``default_effort``
    is set; ``stream_field`` is how the reasoning is streamed (None: the engine's own shape)."""

    model_config = ConfigDict(extra="forbid")

    median_tokens: EffortMedians = Field(default_factory=EffortMedians)
    sigma: float = Field(0.6, ge=0, description="the reasoning length's lognormal sigma")
    default_effort: Literal["minimal", "low", "medium", "high"] | None = Field(
        None, description="the effort of a request that asks nothing (None: it does not reason)")
    stream_field: Literal["reasoning_content", "reasoning", "think_tags"] | None = Field(
        None, description="chat's reasoning delta: reasoning_content (SGLang, llama.cpp), reasoning (vLLM >= "
                          "0.11.2), think_tags (<think>...</think> inline in content: TGI, no parser); None: "
                          "the engine's own")
    mixed_boundary: bool = Field(False, description="the last reasoning token and the first answer token leave "
                                                    "in one chunk carrying both (vLLM's multi-token steps)")

    def field_for(self, engine: str) -> str:
        """The chat delta field the reasoning goes in, for ``engine`` when ``stream_field`` is unset."""
        if self.stream_field is not None:
            return self.stream_field
        return {"vllm": "reasoning", "sglang": "reasoning_content", "llamacpp": "reasoning_content"}.get(
            engine, "think_tags")


class EngineConfig(BaseModel):
    """A continuous-batching engine: scheduler limits plus a roofline-shaped step-time model.

    step_ms = overhead_ms
            + compute_ms_per_token × prefill tokens in the step              (compute-bound: prefill)
            + decode_ms_per_token × decoding sequences in the step           (default: compute_ms_per_token)
            + attention_ms_per_token2 × Σ prefill token × its context position (grows with prompt length)
            + weights_read_ms + kv_read_ms_per_token × Σ running context      (bandwidth-bound: decode)
    """

    model_config = ConfigDict(extra="forbid")

    model: str = "sim-llama"
    max_model_len: int = Field(32768, gt=0)
    # scheduler: whose batching policy (engine.py's docstring), and its limits
    engine: Literal["vllm", "sglang", "llamacpp", "tgi"] = "vllm"
    max_num_batched_tokens: int = Field(8192, gt=0)
    max_num_seqs: int = Field(256, gt=0)
    chunked_prefill: bool = False
    kv_cache_tokens: int = Field(400_000, gt=0)  # vllm, sglang: preempt when short; llamacpp, tgi: reserve
    # automatic prefix caching (prefix_cache.py): reuse the KV of full blocks whose whole prefix matches
    prefix_caching: bool = False
    block_size_tokens: int = Field(16, ge=1, le=1024)
    # TGI's router: a new prefill batch waits for waiting >= ratio x running, or this many decode steps
    max_waiting_tokens: int = Field(20, ge=0)
    waiting_served_ratio: float = Field(1.2, ge=0)
    # cost model (ms)
    overhead_ms: float = Field(1.0, ge=0)
    compute_ms_per_token: float = Field(0.03, ge=0)
    decode_ms_per_token: float | None = Field(None, ge=0, description="compute per decoding sequence in a step "
                                              "(None: compute_ms_per_token, as on a GPU; a fitted model sets it)")
    attention_ms_per_token2: float = Field(1e-5, ge=0)
    weights_read_ms: float = Field(6.5, ge=0)
    kv_read_ms_per_token: float = Field(2e-5, ge=0)
    # output length when the client does not force it (ignore_eos): lognormal, clipped to [min_tokens, max_tokens]
    natural_output_median: float = Field(200, gt=0)
    natural_output_sigma: float = Field(0.8, ge=0)
    # reasoning and tool calls (reasoning.py): only for requests that ask (or reasoning.default_effort)
    reasoning: ReasoningConfig = Field(default_factory=ReasoningConfig)
    tool_call_probability: float = Field(0.5, ge=0, le=1, description="tool_choice auto: share of answers that "
                                         "are a tool call")
    tool_call_median_tokens: float = Field(40, gt=0, description="a tool call's arguments: median tokens")
    tool_call_sigma: float = Field(0.5, ge=0, description="... and the lognormal's sigma")
    # runtime
    time_scale: float = Field(1.0, gt=0, description="multiplies every modelled duration in real time")
    max_chunk_tokens: int = Field(1, ge=1, description="coalesce up to K tokens per SSE chunk")
    spin_ms: float = Field(1.5, ge=0, description="busy-wait this long before a step's end for sub-ms precision")
    seed: int = 0
    faults: FaultConfig = Field(default_factory=FaultConfig)

    @property
    def splits_prompts(self) -> bool:
        """Whether a prompt longer than the budget is prefilled over several steps (llama.cpp always does:
        its ``n_batch`` slices)."""
        return self.chunked_prefill or self.engine == "llamacpp"

    @property
    def prefill_only_batches(self) -> bool:
        """SGLang and TGI run a prefill as a batch of its own: the running decodes wait for it."""
        return self.engine in ("sglang", "tgi")

    @property
    def reserves_kv(self) -> bool:
        """llama.cpp and TGI hold a request's whole context (prompt + max_tokens) from its admission and never
        preempt (engine.py's docstring): a request waits in the queue until the free KV holds all of it."""
        return self.engine in ("llamacpp", "tgi")

    @model_validator(mode="after")
    def _budget_holds_a_prompt(self) -> "EngineConfig":
        if self.splits_prompts and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs when prompts are split "
                             "(chunked_prefill, or engine llamacpp)")
        return self


PRESETS: dict[str, dict[str, Any]] = {
    # Phi-3 Mini FP16 on a T4 (7.6 GB of weights at ~300 GB/s): decode ~36 ms/token at batch 1,
    # prefill ~0.6 ms/token (1k-token prompt: ~0.64 ms/token).
    "t4-phi3-mini": dict(model="phi-3-mini", max_model_len=4096, max_num_batched_tokens=4096, max_num_seqs=64,
                         kv_cache_tokens=30_000, overhead_ms=3.0, compute_ms_per_token=0.58,
                         attention_ms_per_token2=2e-5, weights_read_ms=32.0, kv_read_ms_per_token=1.2e-4),
    # Llama-2-7B FP16 on an A100-80GB: ~46 ms to prefill 1024 tokens, ~7.6 ms per decode step at batch 1.
    "a100-llama-7b": dict(model="llama-2-7b", max_model_len=32768, max_num_batched_tokens=16384, max_num_seqs=256,
                          kv_cache_tokens=400_000, overhead_ms=1.0, compute_ms_per_token=0.0325,
                          attention_ms_per_token2=1e-5, weights_read_ms=6.5, kv_read_ms_per_token=2.5e-5),
    # Llama-3-8B BF16 on an H100-SXM: published roofline estimate (16 GB at ~3.3 TB/s, ~2× A100 compute);
    # not calibrated on hardware.
    "h100-llama-8b": dict(model="llama-3-8b", max_model_len=32768, max_num_batched_tokens=16384, max_num_seqs=512,
                          kv_cache_tokens=900_000, overhead_ms=0.8, compute_ms_per_token=0.016,
                          attention_ms_per_token2=5e-6, weights_read_ms=4.9, kv_read_ms_per_token=8e-6),
}
DEFAULT_PRESET = "a100-llama-7b"


def parse_value(text: str) -> Any:
    """A command-line override's value, read as YAML (``false``, ``8``, ``0.5``, ``{a: 1}``)."""
    return yaml.safe_load(text)


def build_config(preset: str | None = None, file: Path | None = None,
                 overrides: dict[str, Any] | None = None) -> EngineConfig:
    """Preset, then a YAML file, then field overrides (dotted keys reach ``faults.*``); later wins."""
    name = preset or DEFAULT_PRESET
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
    data: dict[str, Any] = dict(PRESETS[name])
    if file is not None:
        loaded = yaml.safe_load(Path(file).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{file}: expected a mapping of engine fields")
        _merge(data, loaded)
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    return EngineConfig.model_validate(data)


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
