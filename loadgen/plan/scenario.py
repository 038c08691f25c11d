"""A scenario: pydantic models of the target, the traffic and the SLOs (reading the file: scenario_file.py).

Limits checked here, before anything is sent, so that no input can exhaust memory or run forever: numbers are
finite (no inf/NaN), token lengths at most ``MAX_TOKENS``, concurrency and ``max_in_flight`` at most
``MAX_CONCURRENCY``, durations at most ``MAX_DURATION_S``, and an open-loop plan at most ``MAX_PLAN_REQUESTS``
requests (the plan and its prompts are built before the first send).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence, Union
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from loadgen.plan.conversation_spec import MAX_TURNS as MAX_TURNS, Conversation as Conversation
from loadgen.plan.lengths_spec import (MAX_TOKENS as MAX_TOKENS, Component as Component, Distribution as Distribution,
                                       Empirical as Empirical, Exponential as Exponential, Fixed as Fixed,
                                       LogNormal as LogNormal, Mixture as Mixture, Normal as Normal, Uniform as Uniform)
from loadgen.plan.session_spec import Reasoning, Session, Tool, check_api, check_class
from loadgen.plan.simulator_spec import SimulatorSpec
from loadgen.plan.slo_spec import Slo
from loadgen.plan.steady_spec import SteadyState, steady_state_field
from loadgen.plan.until_spec import Until, UntilRule, max_duration_field, until_field
from loadgen.errors import ScenarioError as ScenarioError


MAX_CONCURRENCY = 10_000  # concurrent requests: each holds a socket and a stream
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_PLAN_REQUESTS = 1_000_000  # open loop: planned in full before the first send


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---- sections ------------------------------------------------------------------------------------------
class Tls(_Strict):
    """https targets: certificate checks and client certificates (the lean transport keeps its timestamps)."""

    verify: bool = Field(True, description="check the server's certificate and host name (off: warned)")
    ca_bundle: Path | None = Field(None, description="PEM file of CAs to trust instead of the system's")
    client_cert: Path | None = Field(None, description="PEM client certificate (mutual TLS)")
    client_key: Path | None = Field(None, description="its private key, if not in client_cert")

    @model_validator(mode="after")
    def _pair(self) -> "Tls":
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("client_key needs client_cert")
        return self


class Target(_Strict):
    base_url: str = Field("embedded", description="OpenAI-compatible base URL ending in /v1, or 'embedded'")
    model: str = Field("auto", description="model name; 'auto' = the first of GET /v1/models")
    api: Literal["chat", "completions", "responses", "messages", "embeddings"] = Field(
        "chat", description="chat, completions, responses (OpenAI Responses), messages (Anthropic), embeddings")
    api_key_env: str | None = Field(None, description="environment variable holding the API key")
    headers: dict[str, str] = Field(default_factory=dict, description="extra HTTP headers on every request "
                                    "(sensitive values are masked in run.json and logs)")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every request's JSON body "
                                       "(temperature, say)")
    tokenizer: Path | None = Field(None, description="a local tokenizer.json for exact prompt lengths")
    continuous_usage_stats: bool = Field(True, description="ask vLLM-style per-chunk usage (off when refused)")
    ttft_timeout_s: float = Field(60.0, gt=0, description="seconds with no token after sending: timeout_ttft")
    idle_timeout_s: float = Field(30.0, gt=0, description="seconds with no bytes mid-stream: timeout_idle")
    request_timeout_s: float = Field(600.0, gt=0, description="seconds from send to last byte, at "
                                     "most: timeout_request")
    connect_timeout_s: float = Field(10.0, gt=0, description="seconds for a TCP (and TLS) connection, at most")
    preflight_timeout_s: float = Field(30.0, gt=0, description="seconds per check before the run")
    max_event_bytes: int = Field(1 << 20, ge=1024, description="bytes in one SSE line or event, at "
                                   "most: protocol error")
    follow_redirects: bool = Field(False, description="follow 307/308 redirects with the method and body kept "
                                   "(never sending credentials to another origin); off: a redirect is an error "
                                   "naming the URL to use")
    tls: Tls = Field(default_factory=Tls, description="https: certificate checks and client certificates")
    simulator: SimulatorSpec = Field(default_factory=SimulatorSpec,
                                     description="embedded: the simulator's preset and engine fields")
    power_metrics: list[str] = Field(default_factory=list, description="the GPUs' power metrics, scraped like "
                                     "/metrics (DCGM exporter or nvidia_gpu_exporter; summed over GPUs and URLs): "
                                     "http(s)://host:port/metrics, or a /path on the target's own host; gives "
                                     "energy per token (docs/figures.md)")

    @field_validator("power_metrics")
    @classmethod
    def _power_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not (url.startswith("/") or re.match(r"^https?://[^/\s]+", url)):
                raise ValueError(f"{url!r}: must be http(s)://host[:port]/path or a /path on the target's host")
        return urls

    @field_validator("extra_body")
    @classmethod
    def _one_choice(cls, body: dict[str, Any]) -> dict[str, Any]:
        """``n`` > 1 (or ``best_of`` > 1): a server streams the choices interleaved in one stream, and loadgen
        times one stream per request (their tokens would be timed as one answer's: ITL of microseconds)."""
        for name in ("n", "best_of"):
            value = body.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1:
                raise ValueError(f"extra_body.{name} is {value}: loadgen times one streamed answer per request, and "
                                 f"{name} > 1 streams several choices interleaved in one stream; send more requests "
                                 f"instead (remove {name}, or set it to 1)")
        return body

    @property
    def embedded(self) -> bool:
        return self.base_url == "embedded"

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        return base_url_checked(value)

    @model_validator(mode="after")
    def _client_blocks_embedded(self) -> "Target":
        why = self.simulator.client_blocks_refusal(self.embedded)  # a slow client is the embedded sim's fault
        if why is not None:
            raise ValueError(why)
        return self


def base_url_checked(value: str) -> str:
    """``target.base_url`` (``--base-url``, api's ``base_url``) without its trailing slash; ValueError naming what
    is wrong. Port 0 is refused: no server listens there (it asks the OS for any port), and it is not the default."""
    if value == "embedded":
        return value
    if not re.match(r"^https?://[^/\s]+", value):
        raise ValueError("must be http(s)://host[:port]/v1 or 'embedded'")
    try:
        port = urlsplit(value).port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError("the port must be a number from 1 to 65535")
    return value.rstrip("/")


class Stage(_Strict):
    duration_s: float = Field(gt=0, le=MAX_DURATION_S, description="seconds this stage lasts, after the one before")
    rate_per_s: float = Field(gt=0, description="requests per second in this stage (Poisson arrivals)")


class TraceFile(_Strict):
    """A trace to replay: send times and lengths per row (JSONL or CSV). ``format: mooncake`` reads Mooncake's
    traces (``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``): each hash id names a block of
    ``block_tokens`` prompt tokens, and requests that share leading hash ids get the same leading text, so the
    trace's prefix sharing reaches the server."""

    path: Path = Field(description="the trace: JSONL (a .jsonl suffix, or mooncake) or CSV with a header row; "
                       "relative to the scenario file")
    format: Literal["columns", "mooncake"] = Field("columns", description="columns: the *_column fields name "
                                                   "the columns; mooncake: Mooncake's own fields")
    time_column: str = Field("timestamp_s", description="columns: send time in seconds from any origin")
    prompt_column: str = Field("prompt_tokens", description="columns: the prompt's length in tokens")
    output_column: str = Field("output_tokens", description="columns: the output's length in tokens")
    block_tokens: int = Field(512, ge=1, le=65536, description="mooncake: prompt tokens per hash id")
    speedup: float = Field(1.0, gt=0, description="divides every send time (2: the trace replayed twice as fast)")


class Ramp(_Strict):
    """Arrivals whose rate goes from ``start_rate_per_s`` to ``end_rate_per_s`` over warm-up + duration."""

    start_rate_per_s: float = Field(gt=0, description="requests per second at the start of the warm-up")
    end_rate_per_s: float = Field(gt=0, description="requests per second at the end of the duration")
    shape: Literal["linear", "exponential"] = Field("linear", description="linear: the rate changes by the same "
                                                    "step each second; exponential: by the same factor")
    poisson: bool = Field(True, description="random arrivals at the ramp's rate (false: evenly spaced)")

    def mean_rate_per_s(self) -> float:
        r0, r1 = self.start_rate_per_s, self.end_rate_per_s
        if self.shape == "linear" or math.isclose(r0, r1):
            return (r0 + r1) / 2
        return (r1 - r0) / math.log(r1 / r0)


class Load(_Strict, UntilRule):
    arrival: Literal["constant", "poisson", "gamma", "concurrency", "stages", "trace", "ramp"] = Field(
        "poisson", description="constant, poisson, gamma: open loop at rate_per_s; concurrency: closed loop; "
        "stages, trace, ramp: the block of that name")
    rate_per_s: float | None = Field(None, gt=0, description="requests per second (constant, poisson, gamma)")
    ramp: Ramp | None = Field(None, description="arrival ramp: the rate's start, end and shape")
    burstiness: float = Field(1.0, gt=0, description="gamma shape: 1 = Poisson, <1 burstier, >1 smoother")
    concurrency: int | None = Field(None, ge=1, le=MAX_CONCURRENCY, description="closed loop: N users, each "
                                    "sending when its last request ends")
    stages: list[Stage] | None = Field(None, description="arrival stages: Poisson stages run one after another")
    trace: TraceFile | None = Field(None, description="arrival trace: the file whose send times and lengths replay")
    duration_s: float | None = Field(None, gt=0, le=MAX_DURATION_S, description="seconds of measured load after "
                                     "the warm-up (give this or requests; stages and traces have their own)")
    requests: int | None = Field(None, ge=1, le=MAX_PLAN_REQUESTS, description="at most this many arrivals, "
                                 "warm-up included, unless the duration ends first (traces: every row)")
    warmup_s: float = Field(0.0, ge=0, le=MAX_DURATION_S, description="seconds sent and recorded first, then "
                            "excluded from every metric")
    until: Until = until_field()
    max_duration_s: float | None = max_duration_field()
    steady_state: SteadyState = steady_state_field()
    max_in_flight: int = Field(256, ge=1, le=MAX_CONCURRENCY, description="cap on concurrent requests; a send "
                               "waiting for a slot shows as queue_delay_ms")
    max_rate_per_s: float | None = Field(None, gt=0, description="closed loop: the users together never send "
                                         "more than this many requests per second")
    drain_timeout_s: float = Field(30.0, ge=0, le=MAX_DURATION_S, description="after the last send, in-flight "
                                   "requests get this long to end; then they are cancelled and the run ends")
    fail_fast_requests: int = Field(10, ge=0, le=MAX_PLAN_REQUESTS, description="stop the run when the first N "
                                    "requests to end all failed, with the first error's message (0: never)")

    @model_validator(mode="after")
    def _consistent(self) -> "Load":
        needs = {"constant": "rate_per_s", "poisson": "rate_per_s", "gamma": "rate_per_s",
                 "concurrency": "concurrency", "stages": "stages", "trace": "trace", "ramp": "ramp"}[self.arrival]
        if getattr(self, needs) is None:
            raise ValueError(f"arrival {self.arrival!r} needs load.{needs}")
        if self.max_rate_per_s is not None and self.arrival != "concurrency":
            raise ValueError("load.max_rate_per_s caps closed-loop load (arrival: concurrency); an open-loop "
                             "rate is load.rate_per_s")
        if self.arrival not in ("stages", "trace") and self.duration_s is None and self.requests is None:
            raise ValueError("give load.duration_s or load.requests")
        expected = self.expected_requests()
        if expected is not None and expected > MAX_PLAN_REQUESTS:
            raise ValueError(f"the plan would hold ~{expected:,.0f} requests, over the {MAX_PLAN_REQUESTS:,} "
                             "that are planned up front: lower rate_per_s or duration_s, or set requests")
        return self

    def expected_requests(self) -> float | None:
        """About how many requests an open-loop plan holds (None: closed loop or a trace file)."""
        if self.arrival in ("constant", "poisson", "gamma") and self.rate_per_s is not None:
            horizon = self.warmup_s + self.duration_s if self.duration_s is not None else math.inf
            return min(self.rate_per_s * horizon, self.requests or math.inf)
        if self.arrival == "stages" and self.stages:
            return min(sum(s.rate_per_s * s.duration_s for s in self.stages), self.requests or math.inf)
        if self.arrival == "ramp" and self.ramp is not None and self.duration_s is not None:
            return min(self.ramp.mean_rate_per_s() * (self.warmup_s + self.duration_s), self.requests or math.inf)
        return None


class DatasetSpec(BaseModel):
    """Prompts from a file (plan/datasets.py): each arrival of the class takes one row, drawn by the seed."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    path: Path = Field(description="the dataset file (hf: the directory of save_to_disk); relative to the "
                       "scenario file")
    format: Literal["auto", "jsonl", "csv", "parquet", "sharegpt", "hf"] = Field(
        "auto", description="auto: by the suffix (.jsonl .csv .parquet; .json is ShareGPT; a directory is hf)")
    prompt_column: str = Field("prompt", description="jsonl/csv/parquet/hf: the prompt text")
    messages_column: str | None = Field(None, description="jsonl/csv/parquet/hf: OpenAI chat "
                                        "messages instead of a prompt (a list; JSON text in CSV)")
    output_column: str | None = Field(None, description="the recorded answer (text) or its length (a number)")
    split: str = Field("train", description="hf: the split of a saved DatasetDict")
    sample: Literal["random", "sequential"] = Field("random", description="random: rows drawn by the seed; "
                                                    "sequential: in file order, wrapping around")
    min_prompt_tokens: int = Field(0, ge=0, le=MAX_TOKENS, description="keep rows whose estimated prompt has at "
                                   "least this many tokens")
    max_prompt_tokens: int = Field(MAX_TOKENS, ge=1, le=MAX_TOKENS, description="keep rows whose estimated prompt "
                                   "has at most this many tokens")
    max_rows: int | None = Field(None, ge=1, description="use the first N rows that pass the filter")


class RequestClass(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="unique in the workload; names its records")
    weight: float = Field(1.0, gt=0, description="this class's relative share of arrivals")
    prompt_tokens: Distribution | None = Field(None, description="synthetic prompts of these lengths (not with "
                                               "a dataset)")
    output_tokens: Distribution | None = Field(None, description="output lengths (with a dataset: default "
                                               "the recorded answers'; embeddings need none)")
    dataset: DatasetSpec | None = Field(None, description="prompts (and output lengths) from a file")
    shared_prefix_tokens: int = Field(0, ge=0, le=MAX_TOKENS,
                                      description="tokens of a system prompt shared by the class")
    prefix_groups: int = Field(1, ge=1, le=100_000, description="K system prompts of shared_prefix_tokens each; "
                               "arrival i uses group i mod K")
    cache_bust: bool = Field(False, description="put each request's unique tag first, so that no prefix of it "
                             "(not even the shared system prompt) can be served from a prefix cache")
    ignore_eos: bool = Field(True, description="force exactly the sampled output length")
    conversation: Conversation | None = Field(None, description="each arrival is a multi-turn conversation")
    session: Session | None = Field(None, description="each arrival is an agent session (a graph of calls)")
    reasoning: Reasoning | None = Field(None, description="reasoning effort and thinking budget asked")
    tools: list[Tool] | None = Field(None, description="tools offered in the body (chat shape)")

    @model_validator(mode="after")
    def _sources(self) -> "RequestClass":
        check_class(self)
        if self.dataset is None and self.prompt_tokens is None and not self.traced:
            raise ValueError("give prompt_tokens (or a dataset)")
        if self.dataset is not None and self.prompt_tokens is not None:
            raise ValueError("a dataset gives the prompts: drop prompt_tokens (filter with "
                             "dataset.min_prompt_tokens/max_prompt_tokens)")
        if self.dataset is not None and self.shared_prefix_tokens:
            raise ValueError("shared_prefix_tokens makes synthetic system prompts; a dataset brings its own")
        if self.conversation and self.conversation.turns is None and self.dataset is None:
            raise ValueError("conversation.turns is needed (only a dataset's rows can give the turns)")
        if self.conversation and self.conversation.first_prompt_tokens and self.dataset is not None:
            raise ValueError("conversation.first_prompt_tokens is for synthetic prompts, not a dataset's")
        return self

    @property
    def traced(self) -> bool:
        """Its sessions come from an agent trace (which gives every call's lengths)."""
        return self.session is not None and self.session.trace is not None


class Workload(_Strict):
    classes: list[RequestClass] = Field(min_length=1, description="the request classes; each arrival's "
                                        "class is drawn by weight")

    @field_validator("classes")
    @classmethod
    def _unique(cls, classes: list[RequestClass]) -> list[RequestClass]:
        names = [c.name for c in classes]
        if len(set(names)) != len(names):
            raise ValueError(f"class names must be unique: {names}")
        return classes


class Cost(_Strict):
    price_per_hour: float = Field(gt=0, description="what the whole deployment under test costs per hour (every "
                                  "GPU and node serving it), in currency")
    currency: str = Field("USD", min_length=1, max_length=8, description="the price's currency, as it is shown")


class Scenario(_Strict):
    name: str = Field(description="names the run and its directory (reports/<time>-<name>)")
    description: str = Field("", description="free text about the scenario (kept in run.json)")
    target: Target = Field(default_factory=Target, description="the endpoint, its API and the timeouts")
    seed: int = Field(0, description="same seed, same plan: arrivals, classes, lengths and prompts")
    load: Load = Field(description="how requests arrive and for how long")
    workload: Workload = Field(description="what is sent: the request classes")
    slo: Slo = Field(default_factory=Slo, description="the objectives the run is judged by")
    cost: Cost | None = Field(None, description="the deployment's price per hour: cost per million tokens "
                              "(docs/figures.md)")
    # the file and --set items it was loaded from (Locust workers load it again); None when built in code
    _source: tuple[Path, list[str]] | None = PrivateAttr(None)
    # each string field the file wrote with ``${VAR}``, unexpanded: its path → the text as written (run.json keeps
    # it for a masked field, so a replay takes the secret from the environment as the run did: docs/shrink.md)
    _env_refs: dict[tuple[str | int, ...], str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _api_fits(self) -> "Scenario":
        for cls in self.workload.classes:
            check_api(cls.name, cls, self.target.api)
            if self.target.api == "embeddings":
                if cls.conversation is not None:
                    raise ValueError(f"workload.classes[{cls.name}]: an embeddings target has no conversations")
            elif cls.output_tokens is None and cls.dataset is None and not cls.traced:
                raise ValueError(f"workload.classes[{cls.name}]: give output_tokens (only embeddings need none)")
        return self

    @property
    def source(self) -> tuple[Path, list[str]] | None:
        """The file and ``--set`` items this scenario was loaded from; None when it was built in code."""
        return self._source

    @property
    def env_refs(self) -> dict[tuple[str | int, ...], str]:
        """Each field the file gave as a ``${VAR}`` reference (its path) → its text as written, unexpanded."""
        return self._env_refs

    def with_source(self, path: Path | None, overrides: Sequence[str] = (),
                    env_refs: dict[tuple[str | int, ...], str] | None = None) -> Scenario:
        """A copy that says which file and ``--set`` items it came from (scenario_file.py's loader sets it;
        Locust workers load the same file again), and its ``${VAR}`` references; ``path=None``: a scenario
        built in code, with no file."""
        copy = self.model_copy()
        copy._source = None if path is None else (path, list(overrides))
        copy._env_refs = dict(env_refs or {})
        return copy
