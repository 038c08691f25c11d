"""``target.simulator``: the embedded simulator's preset and engine fields, typed here so that validating a
scenario does not import the simulator (``local_target``). The simulator validates them again when it starts;
``tests/test_scenario.py`` checks that these fields, bounds and preset names are the simulator's own."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

PRESET_NAMES = ("t4-phi3-mini", "a100-llama-7b", "h100-llama-8b")
DEFAULT_PRESET = "a100-llama-7b"
# faults loadgen injects in its own process, beside the embedded simulator (run/client_faults.py)
CLIENT_FAULTS = ("client_block_ms", "client_block_every_s")
LOADGEN_ONLY = ("preset", "trace", *CLIENT_FAULTS)  # fields loadgen acts on, not engine settings


class _Sparse(BaseModel):
    """Every field optional; only the ones given are kept (and written to run.json)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_serializer(mode="wrap")
    def _given_only(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class SimulatorFaults(_Sparse):
    """Faults the simulator injects on demand; every one is off unless set. client_block_ms is loadgen's own:
    a slow client beside the embedded simulator, to see the SLO-miss ledger's client_lag on purpose
    (docs/causes.md); each block's window is a client_block line in sim_trace.jsonl (trace: true) and a note
    in run.json."""

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
    client_block_ms: float | None = Field(None, ge=0, description="ms: a slow client: loadgen keeps its own "
                                          "event loop busy this long (a CPU hog in its process, not the "
                                          "server's) every client_block_every_s; embedded target, asyncio "
                                          "engine only")
    client_block_every_s: float | None = Field(None, ge=0, description="seconds from the start of sending to the "
                                               "first client block, and between blocks")

    @model_validator(mode="after")
    def _client_blocks_fit(self) -> "SimulatorFaults":
        block_ms, every_s = self.client_block_ms or 0.0, self.client_block_every_s or 0.0
        if block_ms and not every_s:
            raise ValueError("client_block_ms needs client_block_every_s (seconds between blocks, > 0)")
        if every_s and not block_ms:
            raise ValueError("client_block_every_s needs client_block_ms (how long each block is, > 0)")
        if block_ms and every_s * 1e3 <= block_ms:
            raise ValueError(f"client_block_every_s ({every_s:g} s) must be longer than client_block_ms "
                             f"({block_ms:g} ms): the loop must run between blocks")
        return self

    @property
    def client_blocks(self) -> tuple[float, float] | None:
        """(client_block_ms, client_block_every_s) when loadgen is to block its own loop; None: off."""
        if self.client_block_ms and self.client_block_every_s:
            return self.client_block_ms, self.client_block_every_s
        return None


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
        """The engine fields given (the preset's values stand for the rest), as the simulator takes them: the
        faults loadgen injects itself (CLIENT_FAULTS) left out."""
        out = {k: v for k, v in self.model_dump().items() if k not in LOADGEN_ONLY}
        faults = {k: v for k, v in out.pop("faults", {}).items() if k not in CLIENT_FAULTS}
        return {**out, "faults": faults} if faults else out

    def client_blocks_refusal(self, embedded: bool) -> str | None:
        """Why these client blocks cannot run against this target (one line), None when they can: they slow
        loadgen beside its own simulator, whose trace records them; against a URL they would only slow the
        measurement of someone else's server."""
        if self.faults is None or self.faults.client_blocks is None or embedded:
            return None
        return ("target.simulator.faults.client_block_ms: a slow client is a fault of the embedded simulator's "
                "runs (target.base_url: embedded); drop it for this target")

    @property
    def preset_name(self) -> str:
        return self.preset or DEFAULT_PRESET
