"""``GET /metrics``: Prometheus text in the configured engine's dialect (vLLM's ``vllm:*``, SGLang's
``sglang:*``, llama.cpp's ``llamacpp:*``, TGI's ``tgi_*``), from counters the engine updates per step.

The hot path only adds to integers and bucket arrays; ``prometheus_client`` renders them at scrape time
through a custom collector (its own Histogram takes a lock per observation, too slow per token).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .power import GpuPower

if TYPE_CHECKING:
    from .engine import Engine, SimRequest, Step

# vLLM's bucket edges (seconds / tokens)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
LENGTH_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)


class Histogram:
    def __init__(self, edges: tuple[float, ...]) -> None:
        self.edges = edges
        self.counts = [0] * (len(edges) + 1)
        self.total = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.edges, value)] += times
        self.total += value * times

    def family(self, name: str, doc: str, labels: dict[str, str]) -> HistogramMetricFamily:
        buckets, running = [], 0
        for edge, count in zip(self.edges, self.counts):
            running += count
            buckets.append((repr(float(edge)), running))
        buckets.append(("+Inf", running + self.counts[-1]))
        fam = HistogramMetricFamily(name, doc, labels=list(labels))
        fam.add_metric(list(labels.values()), buckets, self.total)
        return fam


class EngineMetrics:
    def __init__(self) -> None:
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.ttft_s = Histogram(TTFT_BUCKETS_S)
        self.itl_s = Histogram(ITL_BUCKETS_S)
        self.iteration_tokens = Histogram(ITERATION_TOKEN_BUCKETS)
        self.requests_total = 0
        self.input_length = Histogram(LENGTH_BUCKETS)  # TGI observes both when a request finishes
        self.generated_tokens = Histogram(LENGTH_BUCKETS)
        self.power = GpuPower()  # GET /gpu/metrics: a synthetic DCGM exporter (power.py)

    @property
    def iteration_tokens_count(self) -> int:
        return sum(self.iteration_tokens.counts)

    def record_finish(self, req: "SimRequest") -> None:
        self.requests_total += 1
        self.input_length.observe(req.prompt_tokens)
        self.generated_tokens.observe(req.generated)

    def record_step(self, engine: "Engine", step: "Step", emitted: list[tuple["SimRequest", int]],
                    t_start: int, t_end: int) -> None:
        self.iteration_tokens.observe(step.num_tokens)
        self.power.step(step.num_tokens, t_end)
        self.generation_tokens_total += len(emitted)
        for req, index in emitted:
            if index == 0:
                self.ttft_s.observe((t_end - req.t_arrival_ns) / 1e9)
            elif req.t_prev_token_ns is not None:
                self.itl_s.observe((t_end - req.t_prev_token_ns) / 1e9)


class _Collector:
    def __init__(self, engine: "Engine", metrics: EngineMetrics, model: str) -> None:
        self.engine, self.metrics, self.labels = engine, metrics, {"model_name": model, "engine": "0"}

    def collect(self) -> Iterator[object]:
        dialect = {"vllm": self._vllm, "sglang": self._sglang, "llamacpp": self._llamacpp, "tgi": self._tgi}
        yield from dialect[self.engine.cfg.engine]()

    def _vllm(self) -> Iterator[object]:
        e, m, labels = self.engine, self.metrics, self.labels
        yield self._gauge("vllm:num_requests_running", "Requests in the running batch.", len(e.running))
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", len(e.waiting))
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).",
                          e.kv_used / e.cfg.kv_cache_tokens)
        yield self._counter("vllm:num_preemptions", "Cumulative preemptions.", e.num_preemptions)
        yield self._counter("vllm:prompt_tokens", "Prompt tokens received.", m.prompt_tokens_total)
        yield self._counter("vllm:generation_tokens", "Tokens generated.", m.generation_tokens_total)
        yield m.ttft_s.family("vllm:time_to_first_token_seconds", "Time to first token.", labels)
        yield m.itl_s.family("vllm:inter_token_latency_seconds", "Inter-token latency.", labels)
        yield m.iteration_tokens.family("vllm:iteration_tokens_total", "Tokens per engine step.", labels)
        if e.prefix_cache is not None:
            yield self._counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                e.prefix_cache.queries_tokens)
            yield self._counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                e.prefix_cache.hits_tokens)

    def _sglang(self) -> Iterator[object]:
        e, m = self.engine, self.metrics
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.", len(e.running))
        yield self._gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", len(e.waiting))
        yield self._gauge("sglang:token_usage", "The token usage.", e.kv_used / e.cfg.kv_cache_tokens)
        if e.prefix_cache is not None:
            queries = e.prefix_cache.queries_tokens
            yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.",
                              e.prefix_cache.hits_tokens / queries if queries else 0.0)
        yield self._counter("sglang:prompt_tokens", "Number of prefill tokens processed.", m.prompt_tokens_total)
        yield self._counter("sglang:generation_tokens", "Number of generation tokens processed.",
                            m.generation_tokens_total)
        yield m.ttft_s.family("sglang:time_to_first_token_seconds", "Time to first token.", self.labels)

    def _llamacpp(self) -> Iterator[object]:
        e, m = self.engine, self.metrics
        yield self._counter("llamacpp:prompt_tokens", "Number of prompt tokens processed.", m.prompt_tokens_total)
        yield self._counter("llamacpp:tokens_predicted", "Number of generation tokens processed.",
                            m.generation_tokens_total)
        yield self._counter("llamacpp:n_decode", "Total number of llama_decode() calls.", m.iteration_tokens_count)
        yield self._gauge("llamacpp:requests_processing", "Number of requests processing.", len(e.running))
        yield self._gauge("llamacpp:requests_deferred", "Number of requests deferred.", len(e.waiting))

    def _tgi(self) -> Iterator[object]:
        e, m = self.engine, self.metrics
        yield self._gauge("tgi_batch_current_size", "Current batch size.", len(e.running))
        yield self._gauge("tgi_queue_size", "Current queue size.", len(e.waiting))
        yield self._counter("tgi_request_count", "Requests received.", m.requests_total)
        yield m.input_length.family("tgi_request_input_length", "Input tokens per request.", {})
        yield m.generated_tokens.family("tgi_request_generated_tokens", "Generated tokens per request.", {})

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(name, doc, labels=list(self.labels))
        fam.add_metric(list(self.labels.values()), value)
        return fam

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=list(self.labels))
        fam.add_metric(list(self.labels.values()), value)
        return fam


def render(engine: "Engine", metrics: EngineMetrics, model: str) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(engine, metrics, model))  # type: ignore[arg-type]
    return generate_latest(registry)
