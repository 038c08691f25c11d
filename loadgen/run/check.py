"""``loadgen check``: can this endpoint be measured honestly? The run's own preflight (target.py: /models, a
one-token probe, the tokenize endpoint, /metrics), then a few probes read exactly as a run reads them
(check_probes.py), each line judged by the pure functions of analysis/check_findings.py and check_result.py.

The probes, one after another, each within ``target.preflight_timeout_s`` (a probe that gets no answer in time
ends the cache probes; the largest-prompt search has ``SEARCH_REQUESTS`` and ``SEARCH_BUDGET_S`` besides; a
prompt's length takes at most eight counts on the tokenize endpoint):

1. three fresh prompts of ``PROBE_PROMPT_TOKENS`` (a unique salt first), each ``PROBE_OUTPUT_TOKENS`` long
   (max_tokens, and ignore_eos/min_tokens as the scenario's first class asks), interleaved with the same prompt
   sent three times: streaming, the first chunk, coalescing, buffering, usage, data after [DONE], the tokenizer,
   caching;
2. GET /models again (its max_model_len) and GET /metrics;
3. the largest prompt: a prompt just under max_model_len and one over it, else a bounded search (max_tokens 1).

On the embedded simulator the whole check takes about ten seconds (docs/check.md); a real engine's time is its
prefill of the largest prompt plus a few short answers.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from loadgen.analysis import check_result as judge
from loadgen.analysis.check_findings import Finding, Probe, after_done, buffering, caching, coalescing, first_chunk, \
    streaming, tokenizer, usage
from loadgen.analysis.check_result import CheckResult
from loadgen.core import engines, prom_text
from loadgen.core.secrets import redact_url
from loadgen.plan.scenario import Scenario, ScenarioError
from loadgen.plan.workload import LinearFit, ServerFault, fit
from loadgen.run.check_probes import PROMPT_CAP_TOKENS, Session, advertised_length, \
    confirm_advertised, open_counting_client, prompt_text, search_largest, stream_probe
from loadgen.run.prepare import note_proxy, target_proxy
from loadgen.run.target import TargetError, auth_headers, call, resolve, start_embedded, token_counter

PROBE_PROMPT_TOKENS = 512
PROBE_OUTPUT_TOKENS = 32
REPEATS = 3  # the same prompt sent this often, and this many fresh (salted) prompts

BUILTIN = """\
# loadgen check's built-in scenario: the target from --base-url (and --model, --api-key-env, --set)
name: check
target: {base_url: embedded, model: auto, api: chat}
load: {arrival: constant, rate_per_s: 1, requests: 1}
workload:
  classes: [{name: check, prompt_tokens: {dist: fixed, value: 512}, output_tokens: {dist: fixed, value: 32}}]
"""


def builtin_scenario(load: Callable[[Path], Scenario]) -> Scenario:
    """The minimal scenario ``check`` uses without a file, read by ``load`` (the caller's overrides apply)."""
    with tempfile.TemporaryDirectory(prefix="loadgen-check-") as tmp:
        path = Path(tmp) / "built-in-check-scenario.yaml"
        path.write_text(BUILTIN)
        return load(path)


def run_check(scenario: Scenario) -> CheckResult:
    """Audit the scenario's target (the embedded simulator started and stopped here). TargetError (exit 2):
    unreachable, or not OpenAI-compatible; ScenarioError: an API that is not streamed."""
    from loadgen.run.runner import event_loop_run

    if scenario.target.api == "embeddings":
        raise ScenarioError("check audits streamed generation; target.api embeddings is not streamed")
    auth_headers(scenario)  # an API key's variable not set: TargetError before anything starts
    sim = start_embedded(scenario, None) if scenario.target.embedded else None
    try:
        return event_loop_run(_check(scenario, sim.base_url if sim else scenario.target.base_url))
    except TargetError:
        raise
    except ServerFault as exc:  # its tokenize endpoint answered a probe's count in another shape: unusable
        raise TargetError(str(exc)) from None
    finally:
        if sim is not None:
            sim.stop()


async def _check(scenario: Scenario, base_url: str) -> CheckResult:
    t0 = time.monotonic()
    client, transport = open_counting_client(scenario, base_url)
    async with client:
        headers, redact = auth_headers(scenario)
        target = await resolve(scenario, client, base_url, headers, redact)
        note_proxy(target, target_proxy(scenario, base_url))
        counter = await token_counter(scenario, client, target)
        session = Session(scenario, client, transport, target, counter)
        findings = await _audit(session)
    shown = {"base_url": "embedded" if scenario.target.embedded else redact_url(base_url), "model": target.model,
             "api": scenario.target.api, "engine": target.engine}
    return CheckResult(shown, findings, transport.requests, time.monotonic() - t0, list(target.notes))


async def _audit(s: Session) -> list[Finding]:
    """Every line, in the order they are shown."""
    fit_ = await fit(s.counter, None)
    before = s.transport.connections
    repeated, salted = await _cache_probes(s, fit_)
    connections = s.transport.connections - before
    answers = [p.chunk_times() for p in salted]
    lines = [streaming(salted), first_chunk(salted, s.scenario.target.api), coalescing(answers), buffering(answers),
             caching(repeated, salted), usage(salted), after_done([*repeated, *salted]),
             tokenizer(salted, _tokenizer_source(s)),
             _tokenize_line(s), await _metrics_line(s)]
    heads = s.heads[:]
    closing = sum(_closes(version, head) for version, head in zip(s.versions, heads))
    lines += [judge.http_version(s.versions[-1] if s.versions else "", s.target.base_url.split(":", 1)[0]),
              judge.compression([h.get("content-encoding", "") for h in heads]),
              judge.keep_alive(len(heads), closing, connections)]
    lines.append(await _max_prompt_line(s, fit_))
    return lines


def _closes(version: str, head: dict[str, str]) -> bool:
    """Does this response end its connection (RFC 9112 §9.3)?"""
    tokens = {t.strip() for t in head.get("connection", "").lower().split(",")}
    return "close" in tokens or (version == "1.0" and "keep-alive" not in tokens)


async def _cache_probes(s: Session, fit_: LinearFit) -> tuple[list[Probe], list[Probe]]:
    """The same prompt ``REPEATS`` times, interleaved with as many fresh ones of its length (a unique salt
    first): (repeated, fresh)."""
    same_text, same_n = await prompt_text(s.counter, PROBE_PROMPT_TOKENS, "check repeated:", fit_)
    exact = _tokenizer_source(s) is not None
    repeated: list[Probe] = []
    salted: list[Probe] = []
    for _ in range(REPEATS):
        repeated.append(await stream_probe(s, same_text, PROBE_OUTPUT_TOKENS, same_n if exact else None))
        text, n = await prompt_text(s.counter, PROBE_PROMPT_TOKENS, f"check {random.getrandbits(40):010x}:", fit_)
        salted.append(await stream_probe(s, text, PROBE_OUTPUT_TOKENS, n if exact else None))
        if any(p.status == 0 for p in (repeated[-1], salted[-1])):  # no answer in time, or no connection
            break  # one is enough to judge by: the check stays bounded
    return repeated, salted


def _tokenizer_source(s: Session) -> str | None:
    """The exact tokenizer prompt lengths come from (None: lengths are calibrated on usage)."""
    if s.target.tokenize_dialect is not None:
        return engines.DIALECTS[s.target.tokenize_dialect][0]
    if s.scenario.target.tokenizer is not None and getattr(s.counter, "exact", False):
        return Path(s.scenario.target.tokenizer).name
    return None


def _tokenize_line(s: Session) -> Finding:
    dialect = s.target.tokenize_dialect
    file = s.scenario.target.tokenizer
    return judge.tokenize_endpoint(dialect, engines.DIALECTS[dialect][0] if dialect else None,
                                   Path(file).name if file else None)


async def _get(s: Session, url: str) -> Any:
    return await call(s.client, "GET", url, s.target.timeout_s, s.target.redact, s.target.follow,
                      headers=s.target.headers)


async def _metrics_line(s: Session) -> Finding:
    try:
        resp = await _get(s, s.target.root + "/metrics")
    except TargetError as exc:
        return judge.metrics_endpoint(None, None, 0, str(exc))
    if resp.status_code != 200:
        return judge.metrics_endpoint(resp.status_code, None, 0)
    try:
        series = len(prom_text.parse(resp.text))
    except ValueError as exc:
        return judge.metrics_endpoint(200, None, 0, str(exc))
    engine = engines.detect_from_metrics(resp.text)
    return judge.metrics_endpoint(200, engines.ENGINES[engine].label if engine else None, series)


async def _max_prompt_line(s: Session, fit_: LinearFit) -> Finding:
    advertised = None
    try:
        resp = await _get(s, s.target.base_url + "/models")
        advertised = advertised_length(resp.json(), s.target.model) if resp.status_code == 200 else None
    except (TargetError, ValueError):
        pass
    exact = _tokenizer_source(s) is not None
    try:
        if advertised is not None:
            tries, stopped = await confirm_advertised(s, s.counter, fit_, advertised, exact)
            return judge.max_prompt(advertised, tries, PROMPT_CAP_TOKENS, stopped)
        tries, stopped = await search_largest(s, s.counter, fit_, PROBE_PROMPT_TOKENS)
    except (ServerFault, asyncio.TimeoutError) as exc:  # the tokenize endpoint failed counting a long prompt
        return judge.max_prompt(advertised, [], PROMPT_CAP_TOKENS, f"counting a long prompt: {exc}")
    return judge.max_prompt(None, tries, PROMPT_CAP_TOKENS, stopped)
