"""Scenario files: the one place YAML is read. A pydantic model of the traffic, target and SLOs.

Loading order: YAML text → ``${VAR:-default}`` expansion in strings → ``--set`` overrides (dotted paths, list
indices as numbers) → validation. Every error names the field, the bad value and its line in the file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)


class ScenarioError(ValueError):
    """A bad scenario file or override; the message is one line a user can act on."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- length distributions ------------------------------------------------------------------------------
class _Clipped(_Strict):
    min: int = Field(1, ge=0, description="clip samples below this")
    max: int | None = Field(None, ge=1, description="clip samples above this")

    @model_validator(mode="after")
    def _order(self) -> "_Clipped":
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class Fixed(_Strict):
    dist: Literal["fixed"]
    value: int = Field(ge=1)


class Uniform(_Clipped):
    dist: Literal["uniform"]
    min: int = Field(ge=1)
    max: int = Field(ge=1)


class Normal(_Clipped):
    dist: Literal["normal"]
    mean: float = Field(gt=0)
    std: float = Field(ge=0)


class LogNormal(_Clipped):
    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)


class Exponential(_Clipped):
    dist: Literal["exponential"]
    mean: float = Field(gt=0)


class Empirical(_Clipped):
    """``histogram: [[lo, hi, weight], ...]`` (uniform inside a bin) or ``file:`` (one length per line)."""

    dist: Literal["empirical"]
    histogram: list[tuple[int, int, float]] | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "Empirical":
        if (self.histogram is None) == (self.file is None):
            raise ValueError("give exactly one of histogram or file")
        for lo, hi, weight in self.histogram or []:
            if lo < 1 or hi < lo or weight < 0:
                raise ValueError(f"bad histogram bin [{lo}, {hi}, {weight}]: need 1 <= lo <= hi, weight >= 0")
        return self


class Component(_Strict):
    weight: float = Field(gt=0)
    dist: "Distribution"


class Mixture(_Clipped):
    dist: Literal["mixture"]
    components: list[Component] = Field(min_length=1)


Distribution = Annotated[Union[Fixed, Uniform, Normal, LogNormal, Exponential, Empirical, Mixture],
                         Field(discriminator="dist")]
Component.model_rebuild()


# ---- sections ------------------------------------------------------------------------------------------
class Target(_Strict):
    base_url: str = Field("embedded", description="OpenAI-compatible base URL ending in /v1, or 'embedded'")
    model: str = Field("auto", description="model name; 'auto' = the first of GET /v1/models")
    api: Literal["chat", "completions"] = "chat"
    api_key_env: str | None = Field(None, description="environment variable holding the API key")
    headers: dict[str, str] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    tokenizer: Path | None = Field(None, description="a local tokenizer.json for exact prompt lengths")
    continuous_usage_stats: bool = Field(True, description="ask vLLM-style per-chunk usage")
    ttft_timeout_s: float = Field(60.0, gt=0)
    idle_timeout_s: float = Field(30.0, gt=0)
    simulator: dict[str, Any] = Field(default_factory=dict, description="preset + engine fields, when embedded")

    @property
    def embedded(self) -> bool:
        return self.base_url == "embedded"

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value != "embedded" and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("must be http(s)://host[:port]/v1 or 'embedded'")
        return value.rstrip("/")

    @field_validator("simulator")
    @classmethod
    def _simulator(cls, value: dict[str, Any]) -> dict[str, Any]:
        from local_target.sim import build_config

        fields = {k: v for k, v in value.items() if k != "preset"}
        build_config(value.get("preset"), overrides=fields)  # raises naming the bad field
        return value


class Stage(_Strict):
    duration_s: float = Field(gt=0)
    rate_per_s: float = Field(gt=0)


class TraceFile(_Strict):
    path: Path
    time_column: str = "timestamp_s"
    prompt_column: str = "prompt_tokens"
    output_column: str = "output_tokens"
    speedup: float = Field(1.0, gt=0)


class Load(_Strict):
    arrival: Literal["constant", "poisson", "gamma", "concurrency", "stages", "trace"] = "poisson"
    rate_per_s: float | None = Field(None, gt=0)
    burstiness: float = Field(1.0, gt=0, description="gamma shape: 1 = Poisson, <1 burstier, >1 smoother")
    concurrency: int | None = Field(None, ge=1)
    stages: list[Stage] | None = None
    trace: TraceFile | None = None
    duration_s: float | None = Field(None, gt=0)
    requests: int | None = Field(None, ge=1)
    warmup_s: float = Field(0.0, ge=0)
    max_in_flight: int = Field(256, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> "Load":
        needs = {"constant": "rate_per_s", "poisson": "rate_per_s", "gamma": "rate_per_s",
                 "concurrency": "concurrency", "stages": "stages", "trace": "trace"}[self.arrival]
        if getattr(self, needs) is None:
            raise ValueError(f"arrival {self.arrival!r} needs load.{needs}")
        if self.arrival not in ("stages", "trace") and self.duration_s is None and self.requests is None:
            raise ValueError("give load.duration_s or load.requests")
        return self


class RequestClass(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    weight: float = Field(1.0, gt=0)
    prompt_tokens: Distribution
    output_tokens: Distribution
    shared_prefix_tokens: int = Field(0, ge=0, description="tokens of a system prompt shared by the class")
    ignore_eos: bool = Field(True, description="force exactly the sampled output length")


class Workload(_Strict):
    classes: list[RequestClass] = Field(min_length=1)

    @field_validator("classes")
    @classmethod
    def _unique(cls, classes: list[RequestClass]) -> list[RequestClass]:
        names = [c.name for c in classes]
        if len(set(names)) != len(names):
            raise ValueError(f"class names must be unique: {names}")
        return classes


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
    """A request is good when it finished without error within every per-request limit given."""

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
    goodput: Goodput | None = None
    stalls: StallSlo = Field(default_factory=StallSlo, validation_alias=AliasChoices("stalls", "spikes"))
    fluidity: FluiditySlo | None = None
    max_generator_lag_ms: float = Field(10.0, gt=0, description="p99 queue_delay_ms above this: inconclusive")


class Scenario(_Strict):
    name: str
    description: str = ""
    target: Target = Field(default_factory=Target)
    seed: int = 0
    load: Load
    workload: Workload
    slo: Slo = Field(default_factory=Slo)


# ---- loading -------------------------------------------------------------------------------------------
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(value: Any, where: str = "") -> Any:
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if os.environ.get(name):  # as in the shell, ":-" also replaces an empty value (an unset CI secret)
                return os.environ[name]
            if default is None and name in os.environ:
                return ""
            if default is None:
                raise ScenarioError(f"{where or 'value'}: environment variable {name} is not set and has no "
                                    f"default (write ${{{name}:-default}})")
            return default
        return _ENV.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}.{i}") for i, v in enumerate(value)]
    return value


def parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"--set {item!r}: expected FIELD=VALUE, e.g. load.rate_per_s=8")
    try:
        return key.strip(), yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"--set {item!r}: value is not valid YAML: {exc}") from None


def apply_override(data: dict[str, Any], key: str, value: Any) -> None:
    node: Any = data
    parts = key.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ScenarioError(f"--set {key}: {'.'.join(parts[:i]) or 'value'} has no item {part}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        else:
            raise ScenarioError(f"--set {key}: {'.'.join(parts[:i])} is not a mapping")


def _line_of(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest node on ``loc`` that exists in the YAML file."""
    node, line = root, None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            node = None
    if node is not None:
        line = node.start_mark.line + 1
    return line


def _format_error(exc: ValidationError, source: str, root: yaml.Node | None, data: dict[str, Any]) -> str:
    first = exc.errors()[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p in _UNION_TAGS))
    field = ".".join(str(p) for p in loc) or "(top level)"
    line = _line_of(root, loc)
    where = f"{source}:{line}" if line else source
    value = first.get("input")
    shown = "" if isinstance(value, dict) or first["type"] == "missing" else f" (got {value!r})"
    more = len(exc.errors()) - 1
    return f"{where}: {field}: {first['msg']}{shown}" + (f" [+{more} more]" if more else "")


_UNION_TAGS = {"fixed", "uniform", "normal", "lognormal", "exponential", "empirical", "mixture"}


def load_scenario(path: Path | str, overrides: list[str] | None = None) -> Scenario:
    """Read, expand, override and validate a scenario file; raise ScenarioError with one clear line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark, context = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        opened = f" ({exc.context} at line {context.line + 1})" if context and context != mark else ""
        raise ScenarioError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}{opened}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a scenario must be a mapping with name, load and workload")
    data = _expand(data)
    for item in overrides or []:
        apply_override(data, *parse_override(item))
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_error(exc, str(path), root, data)) from None
    return _resolve_paths(scenario, path.parent)


def _resolve_paths(scenario: Scenario, base: Path) -> Scenario:
    """Relative files (traces, empirical histograms, tokenizers) are relative to the scenario file."""
    if scenario.load.trace and not scenario.load.trace.path.is_absolute():
        scenario.load.trace.path = base / scenario.load.trace.path
    for cls in scenario.workload.classes:
        for dist in (cls.prompt_tokens, cls.output_tokens):
            if isinstance(dist, Empirical) and dist.file and not dist.file.is_absolute():
                dist.file = base / dist.file
    if scenario.target.tokenizer and not scenario.target.tokenizer.is_absolute():
        scenario.target.tokenizer = base / scenario.target.tokenizer
    return scenario
