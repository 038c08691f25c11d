"""Resolve the run's target before anything is sent: start the embedded simulator if asked, build auth
headers, check the endpoint answers, resolve ``model: auto``, find a token counter. Every failure here is a
``TargetError`` (one line, exit 2); every request here has a deadline, ``target.preflight_timeout_s``."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadgen.core import apis, engines
from loadgen.core.tracker import RequestMeta, StreamTracker
from loadgen.plan.scenario import Scenario
from loadgen.core.secrets import REDACTOR, SENSITIVE_HEADER, Redactor, clip, url_secrets
from loadgen.drivers.http_conn import REDIRECTS
from loadgen.drivers.streamed_post import direct_post
from loadgen.drivers.proxy import proxy_secrets
from loadgen.drivers.redirects import MAX_REDIRECTS, RedirectError, next_hop
from loadgen.plan.workload import (LocalTokenizerCounter, TokenCounter, TokenizeEndpointCounter,
                                   calibrate)
from loadgen.errors import TargetError as TargetError
from loadgen.run.reach import Unreachable, unreachable_words


@dataclass
class ResolvedTarget:
    base_url: str  # ends in /v1
    model: str
    headers: dict[str, str]
    redact: Redactor
    continuous_usage: bool
    tokenize_dialect: str | None = None  # engines.DIALECTS key of the tokenize endpoint that answered
    engine: str | None = None  # engines.ENGINES key, recognised before the run
    sim: Any = None  # the embedded SimProcess, stopped by the runner
    notes: list[str] = field(default_factory=list)
    timeout_s: float = 30.0  # each preflight request
    follow: bool = False  # target.follow_redirects
    proxy: Any = None  # the environment's proxy the requests go through (drivers/proxy.Proxy), if any

    @property
    def has_tokenize(self) -> bool:
        return self.tokenize_dialect is not None

    @property
    def root(self) -> str:
        return self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url


def scenario_secrets(scenario: Scenario) -> list[str]:
    """What must never be shown: sensitive header values, the URLs' secrets (base and power metrics), the API key (if set; as read and
    with surrounding whitespace stripped, as it is sent), a proxy URL's password."""
    secrets = [v for k, v in scenario.target.headers.items() if SENSITIVE_HEADER.search(k)]
    secrets += [v.strip() for v in secrets]
    secrets += url_secrets(scenario.target.base_url) + proxy_secrets()
    for url in scenario.target.power_metrics:  # a GPU exporter's URL may carry a token too
        secrets += url_secrets(url)
    if scenario.target.api_key_env:
        key = os.environ.get(scenario.target.api_key_env, "")
        secrets += [key, key.strip()]
    return secrets


def _field_value(what: str, value: str) -> str:
    """A header value as sent: surrounding whitespace dropped (a key file's final newline), then only visible
    ASCII and spaces (RFC 9110 §5.5); TargetError names ``what``, never the value."""
    value = value.strip()
    if any(not (" " <= c <= "~") for c in value):
        raise TargetError(f"{what} holds a control or non-ASCII character (a line break inside it?); it cannot be "
                          "sent as an HTTP header value")
    return value


def auth_headers(scenario: Scenario) -> tuple[dict[str, str], Redactor]:
    """The request headers, and the process-wide redactor with this scenario's secrets registered."""
    REDACTOR.register(*scenario_secrets(scenario))
    headers = {"accept-encoding": "identity"}
    for name, value in scenario.target.headers.items():
        if not name or any(not ("!" <= c <= "~") or c in '"(),/:;<=>?@[\\]{}' for c in name):
            raise TargetError(f"target.headers: {name!r} is not a valid header name (RFC 9110 §5.1)")
        headers[name] = _field_value(f"target.headers.{name}", value)
    env = scenario.target.api_key_env
    anthropic = scenario.target.api == "messages"
    if anthropic:
        headers.setdefault("anthropic-version", apis.ANTHROPIC_VERSION)
    if env:
        key = _field_value(f"target.api_key_env: the value of {env}", os.environ.get(env) or "")
        if not key:
            raise TargetError(f"target.api_key_env: environment variable {env} is not set")
        headers["x-api-key" if anthropic else "authorization"] = key if anthropic else f"Bearer {key}"
    return headers, REDACTOR


def sim_trace_path(scenario: Scenario, run_dir: Path) -> Path | None:
    """Where the embedded simulator writes its ground truth: only when ``target.simulator.trace`` asks (a trace
    holds every token, ~80 bytes each, measured: ~1.4 GB for an hour at 5,000 tokens/s)."""
    return run_dir / "sim_trace.jsonl" if scenario.target.simulator.trace else None


def start_embedded(scenario: Scenario, run_dir: Path | None) -> Any:
    """Start the bundled simulator for this scenario; its trace goes into ``run_dir`` when asked for."""
    from local_target.sim import SimulatorStartError, build_config, start_simulator

    spec = scenario.target.simulator
    trace_path = sim_trace_path(scenario, run_dir) if run_dir is not None else None
    try:
        return start_simulator(build_config(spec.preset_name, overrides=spec.overrides()), trace_path=trace_path)
    except (SimulatorStartError, ValueError) as exc:
        raise TargetError(f"embedded simulator: {exc}") from None


JSON_TYPE = {"content-type": "application/json"}


async def call_direct(direct: Any, body: bytes, target: ResolvedTarget, path: str) -> tuple[int, bytes]:
    """``call``'s deadline and errors, on the lean transport's direct path (no httpx objects)."""
    lean, prepared = direct
    try:
        return await asyncio.wait_for(lean.post_bytes(prepared, body), target.timeout_s)
    except asyncio.TimeoutError:
        raise TargetError(f"{target.root}{path}: no answer within {target.timeout_s:g} s "
                          "(target.preflight_timeout_s)") from None
    except httpx.HTTPError as exc:
        raise TargetError(f"cannot reach {target.root}{path}: {target.redact(str(exc)) or type(exc).__name__}") \
            from None


async def call(client: httpx.AsyncClient, method: str, url: str, timeout_s: float, redact: Redactor,
               follow: bool = False, **kwargs: Any) -> httpx.Response:
    """One preflight request with a deadline; no answer in time, or no connection, is a TargetError, and so is
    a redirect (naming the base URL to use instead) unless ``follow`` takes a 307/308 (drivers/redirects.py)."""
    for _ in range(MAX_REDIRECTS + 1):
        resp = await _call_once(client, method, url, timeout_s, redact, **kwargs)
        if resp.status_code not in REDIRECTS:
            return resp
        try:
            url, kwargs["headers"] = next_hop(url, resp.status_code, resp.headers.get("location"), follow,
                                              dict(kwargs.get("headers") or {}))
        except RedirectError as exc:
            raise TargetError(f"{url}: {redact(str(exc))}") from None
    raise TargetError(f"{url}: more than {MAX_REDIRECTS} redirects")


async def _call_once(client: httpx.AsyncClient, method: str, url: str, timeout_s: float, redact: Redactor,
                     **kwargs: Any) -> httpx.Response:
    try:
        return await asyncio.wait_for(client.request(method, url, **kwargs), timeout_s)
    except asyncio.TimeoutError:
        raise TargetError(f"{url}: no answer within {timeout_s:g} s (target.preflight_timeout_s)") from None
    except httpx.ConnectError as exc:
        raise Unreachable(f"cannot reach {url}: {redact(str(exc)) or type(exc).__name__}", exc) from None
    except httpx.HTTPError as exc:
        raise TargetError(f"cannot reach {url}: {redact(str(exc)) or type(exc).__name__}") from None


async def resolve(scenario: Scenario, client: httpx.AsyncClient, base_url: str, headers: dict[str, str],
                  redact: Redactor) -> ResolvedTarget:
    timeout_s, follow = scenario.target.preflight_timeout_s, scenario.target.follow_redirects
    models, base_url, note = await _models(client, base_url, headers, redact, timeout_s, follow)
    if not isinstance(models, dict) or not isinstance(models.get("data", []), list):
        raise TargetError(f"{base_url}/models: the answer is not an OpenAI model list ({{\"data\": [...]}}); "
                          "is this an OpenAI-compatible /v1 URL?")
    entries = models.get("data", [])
    served = [m["id"] for m in entries if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]
    if entries and not served:
        raise TargetError(f"{base_url}/models lists {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} but "
                          "none with an \"id\" string; is this an OpenAI-compatible /v1 URL?")
    model = scenario.target.model
    if model == "auto":
        if not served:
            raise TargetError(f"{base_url}/models lists no model; set target.model")
        model = served[0]
    elif served and model not in served:
        shown = ", ".join(served[:10]) + (f" (+{len(served) - 10} more)" if len(served) > 10 else "")
        raise TargetError(f"model {model!r} is not served by {base_url}; it serves: {shown}")
    target = ResolvedTarget(base_url, model, headers, redact, scenario.target.continuous_usage_stats,
                            timeout_s=timeout_s, follow=follow)
    target.notes += [note] if note else []
    await _probe_generation(scenario, client, target)
    target.tokenize_dialect = await _find_tokenizer(client, target)
    await _recognise_engine(client, target)
    return target


async def _models(client: httpx.AsyncClient, base_url: str, headers: dict[str, str], redact: Redactor,
                  timeout_s: float, follow: bool) -> tuple[Any, str, str | None]:
    """GET {base_url}/models: the answer, the base URL to use, and a note. A base URL without /v1 (vllm bench's
    habit) whose /models answers 404 or no model list is tried again with /v1 appended; if that answers a list,
    the run goes on there, silently (the README says /v1 is optional); where neither does, the error names
    both. No connection at all names the base URL as given, with a hint (run/reach.py). A redirect stays a
    TargetError (``call``)."""
    url = f"{base_url}/models"
    try:
        resp = await call(client, "GET", url, timeout_s, redact, follow, headers=headers)
    except Unreachable as exc:
        raise TargetError(unreachable_words(redact(base_url) or base_url, exc.error) or str(exc)) from None
    why = _not_models(resp)
    if why is None or base_url.rstrip("/").endswith("/v1"):
        return _json(url, resp, redact), base_url, None
    alt = base_url.rstrip("/") + "/v1"
    second = await call(client, "GET", f"{alt}/models", timeout_s, redact, follow, headers=headers)
    why_alt = _not_models(second)
    if why_alt is not None or second.status_code != 200:
        raise TargetError(f"{url}: {why}, and {alt}/models: {why_alt or f'HTTP {second.status_code}'}; is this an "
                          "OpenAI-compatible URL (…/v1)?")
    return second.json(), alt, None


def _not_models(resp: httpx.Response) -> str | None:
    """Why this GET /models answer is not an OpenAI model list (None: it is, or it failed another way)."""
    if resp.status_code == 404:
        return "HTTP 404"
    if resp.status_code != 200:
        return None
    try:
        data = resp.json()
    except ValueError:
        return "no JSON" + (" (an HTML page)" if "html" in resp.headers.get("content-type", "") else "")
    return None if isinstance(data, dict) and isinstance(data.get("data"), list) else "no model list"


def _json(url: str, resp: httpx.Response, redact: Redactor) -> Any:
    if resp.status_code in (401, 403):
        raise TargetError(f"{url}: HTTP {resp.status_code}: authentication failed (check target.api_key_env)")
    if resp.status_code != 200:
        raise TargetError(f"{url}: HTTP {resp.status_code}: {clip(redact(resp.text) or '', 200)}")
    try:
        return resp.json()
    except ValueError:
        raise TargetError(f"{url}: the answer is not JSON; is this an OpenAI-compatible /v1 URL?") from None


async def _probe_generation(scenario: Scenario, client: httpx.AsyncClient, target: ResolvedTarget) -> None:
    """One tiny streamed request (embeddings: one embedding): the model answers, and the server takes
    continuous_usage_stats (chat and completions)."""
    api = scenario.target.api
    path = apis.PATHS[api]
    body = apis.probe_body(api, target.model, "hi", stream=api != "embeddings")
    if api not in ("chat", "completions"):
        target.continuous_usage = False
    if target.continuous_usage:
        body["stream_options"]["continuous_usage_stats"] = True
    resp = await _post(client, target.base_url + path, body, target)
    if resp.status_code == 400 and target.continuous_usage and "usage" in resp.text:
        target.continuous_usage = False
        target.notes.append("the server refused continuous_usage_stats; tokens per chunk are counted locally")
        del body["stream_options"]["continuous_usage_stats"]
        resp = await _post(client, target.base_url + path, body, target)
    if resp.status_code != 200:
        raise TargetError(f"{target.base_url}{path}: HTTP {resp.status_code} for model {target.model!r}: "
                          f"{clip(target.redact(resp.text) or '', 200)}")
    wrong = probe_answer_error(api, resp.content)
    if wrong is not None:
        raise TargetError(f"{target.base_url}{path}: the probe's answer (model {target.model!r}): "
                          f"{clip(target.redact(wrong) or '', 300)}")


def probe_answer_error(api: str, content: bytes) -> str | None:
    """Why a probe's 200 answer is not one a run can measure (an error sent with status 200, a JSON body where
    a stream was asked for, a stream that does not end), read as the run will read it; None: it is fine."""
    tracker = StreamTracker(RequestMeta(0, "probe", False, 0, 1, 1), 0, api=api)
    tracker.feed(content, 1)
    record, _ = tracker.finish(2)
    return record.error_message if record.error_kind else None


PROBE_ATTEMPTS = 5


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, Any], target: ResolvedTarget) -> httpx.Response:
    """POST a probe; 5xx and 429 are retried (a flaky server is the run's to measure, not a config error)."""
    for attempt in range(1, PROBE_ATTEMPTS + 1):
        resp = await call(client, "POST", url, target.timeout_s, target.redact, target.follow, json=body,
                          headers=target.headers)
        if resp.status_code < 500 and resp.status_code != 429 or attempt == PROBE_ATTEMPTS:
            return resp
        await asyncio.sleep(0.2 * attempt)  # back off before retrying a transient server error
    raise AssertionError("unreachable")


async def _find_tokenizer(client: httpx.AsyncClient, target: ResolvedTarget) -> str | None:
    """The first tokenize dialect the server answers in a way its reader understands (engines.DIALECTS)."""
    for dialect, (path, probe, read) in engines.DIALECTS.items():
        try:
            resp = await call(client, "POST", target.root + path, target.timeout_s, target.redact, target.follow,
                              json={"model": target.model, **probe}, headers=target.headers)
            if resp.status_code == 200 and read(resp.json()) is not None:
                return dialect
        except (TargetError, ValueError):
            continue
    return None


async def _recognise_engine(client: httpx.AsyncClient, target: ResolvedTarget) -> None:
    """From the series /metrics serves, else from the tokenize dialect; one note says what its adapter gives."""
    how = "its /metrics"
    try:
        resp = await call(client, "GET", target.root + "/metrics", target.timeout_s, target.redact, target.follow,
                          headers=target.headers)
        target.engine = engines.detect_from_metrics(resp.text) if resp.status_code == 200 else None
    except TargetError:
        target.engine = None
    if target.engine is None and target.tokenize_dialect in engines.DIALECT_ENGINE:
        target.engine, how = engines.DIALECT_ENGINE[target.tokenize_dialect], "its /tokenize"
    target.notes.append(engines.describe(target.engine, how, target.tokenize_dialect))


async def token_counter(scenario: Scenario, client: httpx.AsyncClient, target: ResolvedTarget) -> TokenCounter:
    """Exact where possible: the server's /tokenize, else a local tokenizer file; else calibrated on usage."""
    direct: dict[str, Any] = {}  # path → the lean transport's prepared POST (a closed loop counts every prompt)

    async def post(path: str, body: dict[str, Any]) -> Any:
        if path not in direct:  # (following redirects: through ``call``, which follows them)
            direct[path] = None if target.follow else direct_post(client, target.root + path,
                                                                   {**target.headers, **JSON_TYPE})
        if direct[path] is not None:
            status, text = await call_direct(direct[path], json.dumps(body).encode(), target, path)
        else:
            resp = await call(client, "POST", target.root + path, target.timeout_s, target.redact, target.follow,
                              json=body, headers=target.headers)
            status, text = resp.status_code, resp.content
        try:
            answer = json.loads(text) if status == 200 else None
        except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than the parser goes
            answer = None
        if status != 200:
            raise TargetError(f"{target.root}{path}: HTTP {status}: "
                              f"{clip(target.redact(text.decode('utf-8', 'replace')) or '', 200)}")
        if not isinstance(answer, (dict, list)):
            raise TargetError(f"{target.root}{path}: the answer is not JSON")
        return answer

    if target.tokenize_dialect is not None:
        return TokenizeEndpointCounter(post, target.model, scenario.target.api, target.tokenize_dialect)
    if scenario.target.tokenizer is not None:
        local = LocalTokenizerCounter(str(scenario.target.tokenizer))
        reported = await _usage_prompt_tokens(scenario, client, target, "hi there")
        local.template_overhead = reported - local.count_text("hi there")
        target.notes.append(f"prompt lengths from {scenario.target.tokenizer} (+{local.template_overhead} "
                            "template tokens)")
        return local
    target.notes.append("no /tokenize and no tokenizer file: prompt lengths are approximate "
                        "(achieved lengths are recorded from usage)")
    return await calibrate(_UsageProbeCounter(scenario, client, target))


class _UsageProbeCounter:
    """Counts a prompt by sending it (max_tokens 1) and reading ``usage.prompt_tokens``: for calibration."""

    exact = True

    def __init__(self, scenario: Scenario, client: httpx.AsyncClient, target: ResolvedTarget) -> None:
        self.scenario, self.client, self.target = scenario, client, target

    async def count(self, system: str | None, user: str) -> int:
        text = f"{system}\n{user}" if system else user
        return await _usage_prompt_tokens(self.scenario, self.client, self.target, text)


async def _usage_prompt_tokens(scenario: Scenario, client: httpx.AsyncClient, target: ResolvedTarget,
                               text: str) -> int:
    api = scenario.target.api
    path = apis.PATHS[api]
    resp = await _post(client, target.base_url + path, apis.probe_body(api, target.model, text, stream=False), target)
    try:
        count = apis.usage_prompt_tokens(api, resp.json())
    except ValueError:
        count = None
    if count is None:
        raise TargetError(f"{target.base_url}{path}: no prompt length in the answer's usage; "
                          "give target.tokenizer for prompt lengths")
    return count
