"""``target.simulator``: the embedded simulator's preset and engine fields, typed here so that validating a
scenario does not import the simulator (``local_target``). The simulator validates them again when it starts;
``tests/test_scenario.py`` checks that these fields, bounds and preset names are the simulator's own."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

PRESET_NAMES = ("t4-phi3-mini", "a100-llama-7b", "h100-llama-8b")
DEFAULT_PRESET = "a100-llama-7b"
LOADGEN_ONLY = ("preset", "trace")  # fields loadgen acts on, not engine settings


class _Sparse(BaseModel):
    """Every field optional; only the ones given are kept (and written to run.json)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_serializer(mode="wrap")
    def _given_only(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class SimulatorFaults(_Sparse):
    error_rate: float | None = Field(None, ge=0, le=1, description="share of requests answered with HTTP 500")
    queue_429_over: int | None = Field(None, ge=0, description="answer 429 when more requests than this wait")
    disconnect_rate: float | None = Field(None, ge=0, le=1, description="share of streams cut mid-stream")
    malformed_rate: float | None = Field(None, ge=0, le=1, description="share of streams with a malformed chunk")
    stall_ms: float | None = Field(None, ge=0, description="an engine-wide stall of this many ms ...")
    stall_every_s: float | None = Field(None, ge=0, description="... injected into one step this often")


class SimulatorSpec(_Sparse):
    """A preset (default a100-llama-7b) and the engine fields that override it."""

    preset: Literal["t4-phi3-mini", "a100-llama-7b", "h100-llama-8b"] | None = None
    trace: bool | None = Field(None, description="write the ground truth, sim_trace.jsonl, into the run "
                                                 "directory (off by default: ~80 bytes per token)")
    model: str | None = None
    max_model_len: int | None = Field(None, gt=0)
    engine: Literal["vllm", "sglang", "llamacpp", "tgi"] | None = Field(None, description="whose scheduler")
    max_num_batched_tokens: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    chunked_prefill: bool | None = None
    kv_cache_tokens: int | None = Field(None, gt=0)
    prefix_caching: bool | None = Field(None, description="reuse the KV of prompt prefixes already computed")
    block_size_tokens: int | None = Field(None, ge=1, le=1024, description="the prefix cache's block size")
    max_waiting_tokens: int | None = Field(None, ge=0)
    waiting_served_ratio: float | None = Field(None, ge=0)
    overhead_ms: float | None = Field(None, ge=0)
    compute_ms_per_token: float | None = Field(None, ge=0)
    decode_ms_per_token: float | None = Field(None, ge=0, description="compute per decoding sequence "
                                              "(default: compute_ms_per_token)")
    attention_ms_per_token2: float | None = Field(None, ge=0)
    weights_read_ms: float | None = Field(None, ge=0)
    kv_read_ms_per_token: float | None = Field(None, ge=0)
    natural_output_median: float | None = Field(None, gt=0)
    natural_output_sigma: float | None = Field(None, ge=0)
    time_scale: float | None = Field(None, gt=0, description="multiplies every modelled duration")
    max_chunk_tokens: int | None = Field(None, ge=1, description="coalesce up to K tokens per SSE chunk")
    spin_ms: float | None = Field(None, ge=0)
    seed: int | None = None
    faults: SimulatorFaults | None = None

    def overrides(self) -> dict[str, Any]:
        """The engine fields given (the preset's values stand for the rest), as the simulator takes them."""
        return {k: v for k, v in self.model_dump().items() if k not in LOADGEN_ONLY}

    @property
    def preset_name(self) -> str:
        return self.preset or DEFAULT_PRESET
