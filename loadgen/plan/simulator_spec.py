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
    """Faults the simulator injects on demand; every one is off unless set."""

    error_rate: float | None = Field(None, ge=0, le=1, description="share of requests answered with HTTP 500")
    queue_429_over: int | None = Field(None, ge=0, description="answer 429 when more requests than this are "
                                  "waiting")
    disconnect_rate: float | None = Field(None, ge=0, le=1, description="share of streams cut mid-stream")
    malformed_rate: float | None = Field(None, ge=0, le=1, description="share of streams with a malformed chunk")
    stall_ms: float | None = Field(None, ge=0, description="ms: an engine-wide stall injected into one step "
                                  "every stall_every_s")
    stall_every_s: float | None = Field(None, ge=0, description="seconds between injected stalls (0: never)")
    network_delay_ms: float | None = Field(None, ge=0, description="ms: requests in network_delay_rate are held "
                                          "this long before the server reads them (response headers included)")
    network_delay_rate: float | None = Field(None, ge=0, le=1, description="share of requests held "
                                             "network_delay_ms")


class SimulatorEffortMedians(_Sparse):
    """Median reasoning tokens per effort (an unset one keeps the simulator's: 0, 128, 512, 2048)."""

    minimal: int | None = Field(None, ge=0, description="tokens: median reasoning at effort minimal")
    low: int | None = Field(None, ge=0, description="tokens: median reasoning at effort low")
    medium: int | None = Field(None, ge=0, description="tokens: median reasoning at effort medium")
    high: int | None = Field(None, ge=0, description="tokens: median reasoning at effort high")


class SimulatorReasoning(_Sparse):
    """How the simulated model reasons: only requests that ask for it (reasoning_effort, enable_thinking,
    Responses reasoning.effort, Anthropic thinking) reason, unless default_effort is set."""

    median_tokens: SimulatorEffortMedians | None = Field(None, description="median reasoning tokens per effort "
                                                         "(a lognormal, capped by the budget and max_tokens)")
    sigma: float | None = Field(None, ge=0, description="the reasoning length's lognormal sigma (default 0.6)")
    default_effort: Literal["minimal", "low", "medium", "high"] | None = Field(
        None, description="the effort of a request that asks nothing (unset: it does not reason)")
    stream_field: Literal["reasoning_content", "reasoning", "think_tags"] | None = Field(
        None, description="chat's reasoning delta: reasoning_content (SGLang, llama.cpp), reasoning (vLLM), "
                          "think_tags (inline in content); unset: the engine's own")
    mixed_boundary: bool | None = Field(None, description="the last reasoning token and the first answer token "
                                        "leave in one chunk carrying both")


class SimulatorSpec(_Sparse):
    """A preset (default a100-llama-7b) and the engine fields that override it; an unset field keeps the
    preset's value (or the engine's default)."""

    preset: Literal["t4-phi3-mini", "a100-llama-7b", "h100-llama-8b"] | None = Field(
        None, description="the modelled hardware and model the engine fields start from (default a100-llama-7b)")
    trace: bool | None = Field(None, description="write the ground truth, sim_trace.jsonl, into the run "
                                                 "directory (off by default: ~80 bytes per token)")
    model: str | None = Field(None, description="the model name it serves and lists at /v1/models")
    max_model_len: int | None = Field(None, gt=0, description="tokens: prompt + output of one request, at most "
                                      "(more: HTTP 400)")
    engine: Literal["vllm", "sglang", "llamacpp", "tgi"] | None = Field(None, description="whose scheduler it "
                                                                        "imitates (vllm when no preset sets it)")
    max_num_batched_tokens: int | None = Field(None, gt=0, description="tokens one step processes, at most (the "
                                               "token budget; llama.cpp's n_batch)")
    max_num_seqs: int | None = Field(None, gt=0, description="requests running at once, at most (llama.cpp: "
                                     "slots)")
    chunked_prefill: bool | None = Field(None, description="split a prompt over the budget across steps (off: "
                                         "a prompt goes in whole and stalls the running decodes)")
    kv_cache_tokens: int | None = Field(None, gt=0, description="tokens the KV cache holds; when it is full the "
                                        "newest running request is preempted")
    prefix_caching: bool | None = Field(None, description="reuse the KV of prompt prefixes already computed")
    block_size_tokens: int | None = Field(None, ge=1, le=1024, description="tokens per prefix-cache block")
    max_waiting_tokens: int | None = Field(None, ge=0, description="tgi: decode steps after which waiting "
                                           "requests get a prefill batch")
    waiting_served_ratio: float | None = Field(None, ge=0, description="tgi: a prefill batch forms when the "
                                               "queue holds this × the running batch")
    overhead_ms: float | None = Field(None, ge=0, description="ms: the fixed cost of every step")
    compute_ms_per_token: float | None = Field(None, ge=0, description="ms per prefill token in a step")
    decode_ms_per_token: float | None = Field(None, ge=0, description="ms of compute per decoding sequence "
                                              "(default: compute_ms_per_token)")
    attention_ms_per_token2: float | None = Field(None, ge=0, description="ms per prefill token × its context "
                                                "position (attention grows with the prompt)")
    weights_read_ms: float | None = Field(None, ge=0, description="ms per step to read the weights (decode is "
                                        "bandwidth-bound)")
    kv_read_ms_per_token: float | None = Field(None, ge=0, description="ms per step per token of running context "
                                             "read")
    natural_output_median: float | None = Field(None, gt=0, description="tokens: median output length when the "
                                                "client does not set ignore_eos (lognormal)")
    natural_output_sigma: float | None = Field(None, ge=0, description="that lognormal's sigma (0: always the "
                                               "median)")
    reasoning: SimulatorReasoning | None = Field(None, description="reasoning lengths and how they stream")
    tool_call_probability: float | None = Field(None, ge=0, le=1, description="tool_choice auto: share of "
                                                "answers that are a tool call (default 0.5)")
    tool_call_median_tokens: float | None = Field(None, gt=0, description="tokens: a tool call's arguments, "
                                                  "median (default 40)")
    tool_call_sigma: float | None = Field(None, ge=0, description="that lognormal's sigma (default 0.5)")
    time_scale: float | None = Field(None, gt=0, description="multiplies every modelled duration")
    max_chunk_tokens: int | None = Field(None, ge=1, description="coalesce up to K tokens per SSE chunk")
    spin_ms: float | None = Field(None, ge=0, description="ms: busy-wait this long before a step's end for "
                                  "sub-ms precision")
    seed: int | None = Field(None, description="seeds the simulator's draws: natural output lengths and faults")
    faults: SimulatorFaults | None = Field(None, description="faults to inject (off by default)")

    def overrides(self) -> dict[str, Any]:
        """The engine fields given (the preset's values stand for the rest), as the simulator takes them."""
        return {k: v for k, v in self.model_dump().items() if k not in LOADGEN_ONLY}

    @property
    def preset_name(self) -> str:
        return self.preset or DEFAULT_PRESET
