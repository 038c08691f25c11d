"""What loadgen knows of each serving engine: how to recognise it, where it counts tokens exactly, and how its
Prometheus ``/metrics`` map to one vocabulary (``running``, ``waiting``, ``kv_cache_usage``,
``preemptions_total``, ``prompt_tokens_total``, ``generation_tokens_total``, ``iteration_tokens_sum/count``,
``steps_total``).

The engine is detected before anything is sent: from the prefix of the series its ``/metrics`` serves, else
from the tokenize endpoint that answered. Pure: no I/O here (``run/target.py`` asks, this module reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineInfo:
    name: str  # as in summary.json and target.simulator.engine
    label: str  # as shown
    metric_prefix: str
    series: dict[str, str]  # sample name in the text exposition → our column
    tokenize: str  # how exact prompt lengths are had (docs/guides/real-server.md)


VLLM = EngineInfo("vllm", "vLLM", "vllm:", {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # before V1
    "vllm:num_preemptions": "preemptions_total",
    "vllm:num_preemptions_total": "preemptions_total",
    "vllm:prompt_tokens": "prompt_tokens_total",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens": "generation_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:iteration_tokens_total_sum": "iteration_tokens_sum",
    "vllm:iteration_tokens_total_count": "iteration_tokens_count",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries_total",  # V1: prompt tokens looked up ...
    "vllm:prefix_cache_hits_total": "prefix_cache_hits_total",  # ... and found in the prefix cache
}, "POST /tokenize (prompt or messages → count)")
SGLANG = EngineInfo("sglang", "SGLang", "sglang:", {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:token_usage": "kv_cache_usage",
    "sglang:prompt_tokens_total": "prompt_tokens_total",
    "sglang:generation_tokens_total": "generation_tokens_total",
    "sglang:cache_hit_rate": "prefix_cache_hit_rate",
}, "POST /tokenize or /v1/tokenize in vLLM's shape, where the version has one")
LLAMACPP = EngineInfo("llamacpp", "llama.cpp", "llamacpp:", {
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "waiting",
    "llamacpp:prompt_tokens_total": "prompt_tokens_total",
    "llamacpp:tokens_predicted_total": "generation_tokens_total",
    "llamacpp:n_decode_total": "steps_total",
}, "POST /apply-template, then POST /tokenize {content}")
TGI = EngineInfo("tgi", "TGI", "tgi_", {
    "tgi_batch_current_size": "running",
    "tgi_queue_size": "waiting",
    "tgi_request_input_length_sum": "prompt_tokens_total",
    "tgi_request_generated_tokens_sum": "generation_tokens_total",
}, "POST /chat_tokenize (chat) or POST /tokenize {inputs}")

ENGINES: dict[str, EngineInfo] = {e.name: e for e in (VLLM, SGLANG, LLAMACPP, TGI)}
SERIES: dict[str, str] = {name: col for e in ENGINES.values() for name, col in e.series.items()}
PREFIXES: tuple[str, ...] = tuple(e.metric_prefix for e in ENGINES.values())

# The GPUs' exporters (``target.power_metrics``, docs/figures.md), read by the same parser as the engines' series:
# family → column, and the factor to the column's unit where the family's differs.
POWER_SERIES: dict[str, str] = {"DCGM_FI_DEV_POWER_USAGE": "gpu_power_w",  # DCGM exporter: W
                                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "gpu_energy_j",  # DCGM exporter: mJ counter
                                "nvidia_smi_power_draw_watts": "gpu_power_w"}  # utkuozdemir/nvidia_gpu_exporter: W
POWER_SCALE: dict[str, float] = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1e-3}  # mJ → J


def detect_from_metrics(text: str) -> str | None:
    """The engine whose series the exposition holds (the most samples wins), or None."""
    counts = dict.fromkeys(ENGINES, 0)
    for line in text.splitlines():
        for e in ENGINES.values():
            if line.startswith(e.metric_prefix):
                counts[e.name] += 1
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] else None


# ---- tokenize dialects: the probe each answers, and how to read its answer ----------------------------------
# (path, probe body, reader of the answer's token count); tried in this order, the first that reads wins.
def _vllm_count(answer: Any) -> int | None:
    return int(answer["count"]) if isinstance(answer, dict) and isinstance(answer.get("count"), int) else None


def _llamacpp_count(answer: Any) -> int | None:
    tokens = answer.get("tokens") if isinstance(answer, dict) and "count" not in answer else None
    return len(tokens) if isinstance(tokens, list) else None


def _tgi_count(answer: Any) -> int | None:
    if isinstance(answer, dict):
        answer = answer.get("tokenize_response")
    return len(answer) if isinstance(answer, list) else None


DIALECTS: dict[str, tuple[str, dict[str, Any], Any]] = {
    "vllm": ("/tokenize", {"prompt": "hi"}, _vllm_count),
    "vllm_v1": ("/v1/tokenize", {"prompt": "hi"}, _vllm_count),
    "llamacpp": ("/tokenize", {"content": "hi"}, _llamacpp_count),
    "tgi": ("/tokenize", {"inputs": "hi"}, _tgi_count),
}
DIALECT_ENGINE = {"llamacpp": "llamacpp", "tgi": "tgi"}  # a dialect that names its engine


RECOGNISED = "(recognised by "  # marks describe()'s line for a known engine: routine, kept off the run's console


def describe(engine: str | None, how: str, dialect: str | None) -> str:
    """One line for the run's notes: the engine, how it was recognised, what its adapter gives."""
    info = ENGINES.get(engine or "")
    name = f"{info.label} {RECOGNISED}{how})" if info else "an OpenAI-compatible server of unknown make"
    lengths = f"exact prompt lengths from {DIALECTS[dialect][0]}" if dialect else "no tokenize endpoint"
    metrics = f"server metrics {info.metric_prefix}*" if info else "no known /metrics series"
    return f"engine: {name}; {lengths}; {metrics}"
