"""The I/O of ``loadgen check`` (run/check.py orchestrates it): a client on the run's own lean transport that
counts the requests and connections it makes, one streamed probe read exactly as a run reads it
(``StreamTracker`` fed the socket-level read stamps, plus the first SSE event of any kind and the response's
head), prompts of a given token length, and the bounded search for the largest prompt accepted."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from loadgen.analysis.check_findings import Probe
from loadgen.analysis.check_result import PromptTry
from loadgen.core.apis import EVENT_PARSERS, PATHS
from loadgen.core.secrets import clip
from loadgen.core.sse import SseDecoder
from loadgen.core.tracker import RequestMeta, StreamTracker
from loadgen.drivers.lean_transport import LeanTransport
from loadgen.drivers.streamed_post import StreamContext, direct_post, send_post
from loadgen.drivers.timing import error_kind
from loadgen.plan.scenario import Scenario
from loadgen.plan.request_bodies import output_cap
from loadgen.plan.workload import LinearFit, Prompt, TokenCounter, filler, request_body
from loadgen.run.prepare import ssl_context, target_proxy
from loadgen.run.target import JSON_TYPE, ResolvedTarget

PROMPT_CAP_TOKENS = 131_072  # the search for the largest prompt stops here
SEARCH_REQUESTS = 10  # ... and after this many requests
SEARCH_BUDGET_S = 30.0  # ... or this long
SEARCH_START_TOKENS = 2048


class CountingTransport(LeanTransport):
    """The run's transport, counting every request sent and every connection opened."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = 0
        self.connections = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return await super().handle_async_request(request)

    async def post(self, prepared: Any, body: bytes, ctx: StreamContext, fresh: bool = False) -> int:
        self.requests += 1
        return await super().post(prepared, body, ctx, fresh)

    async def _connect(self, origin: Any) -> Any:
        self.connections += 1
        return await super()._connect(origin)


def open_counting_client(scenario: Scenario, base_url: str) -> tuple[httpx.AsyncClient, CountingTransport]:
    """A client as a run opens it (prepare.open_client: TLS by target.tls, the environment's proxy), counting."""
    t = scenario.target
    target_proxy(scenario, base_url)  # a proxy setting that cannot be used: TargetError before anything is sent
    transport = CountingTransport(connect_timeout_s=t.connect_timeout_s, ssl_context=ssl_context(scenario),
                                  use_proxy_env=not t.embedded)
    client = httpx.AsyncClient(timeout=httpx.Timeout(connect=t.connect_timeout_s, read=None, write=30.0, pool=None),
                               transport=transport)
    return client, transport


class ProbeReader:
    """Feeds a probe's body to a ``StreamTracker`` (as a run does) and notes its first SSE event of any kind."""

    def __init__(self, api: str, max_event_bytes: int, max_tokens: int) -> None:
        meta = RequestMeta(0, "check", False, 0, 0, max_tokens, keep_text=True)
        self.tracker = StreamTracker(meta, 0, max_event_bytes, api=api)
        self._sse: SseDecoder | None = SseDecoder(max_event_bytes)
        self._parse = EVENT_PARSERS[api]
        self.first_event_ns: int | None = None
        self.first_event_text = False

    def feed(self, data: bytes, t_ns: int) -> None:
        self.tracker.feed(data, t_ns)
        if self._sse is not None:
            for t_event_ns, event in self._sse.feed(data, t_ns):
                self.first_event_ns, self.first_event_text = t_event_ns, bool(self._parse(event).text)
                self._sse = None
                break


@dataclass
class Session:
    """What every probe needs: the scenario, the client and its counting transport, the resolved target."""

    scenario: Scenario
    client: httpx.AsyncClient
    transport: CountingTransport
    target: ResolvedTarget
    counter: TokenCounter
    heads: list[dict[str, str]] = field(default_factory=list)  # each probe's response headers
    versions: list[str] = field(default_factory=list)  # each probe's HTTP version
    _direct: Any = None

    @property
    def url(self) -> str:
        return self.target.base_url + PATHS[self.scenario.target.api]

    @property
    def headers(self) -> dict[str, str]:
        return {**self.target.headers, **JSON_TYPE}

    def body(self, text: str, output_tokens: int) -> dict[str, Any]:
        """The request body a run would send for this prompt (the first class's ignore_eos, extra_body)."""
        cls = self.scenario.workload.classes[0]
        return request_body(self.scenario, self.target.model, cls, Prompt(None, text, None), output_tokens, False)


def response_head(raw: bytes) -> dict[str, str]:
    """The final response's headers (names lower-cased, repeats joined) from its raw bytes; 1xx skipped."""
    while True:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split()
        if not sep or len(status) < 2:
            return {}
        if status[1].startswith("1") and rest:
            raw = rest
            continue
        out: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            out[key] = f"{out[key]}, {value.strip()}" if key in out else value.strip()
        return out


async def stream_probe(s: Session, text: str, output_tokens: int, counted: int | None = None) -> Probe:
    """Send one streamed request and read it as a run does; its ``Probe`` (errors in it, never raised)."""
    sc = s.scenario.target
    reader = ProbeReader(sc.api, sc.max_event_bytes, output_tokens)
    ctx = StreamContext(feed=reader.feed, raw=bytearray())
    if s._direct is None and not s.target.follow:
        s._direct = direct_post(s.client, s.url, s.headers)
    data = json.dumps(s.body(text, output_tokens)).encode()
    meta = reader.tracker.meta  # what bounds the usage a server may claim (core/usage_claims.py)
    meta.body_bytes = len(data)
    meta.output_cap = output_cap(s.scenario, s.scenario.workload.classes[0], output_tokens)
    status, kind, message = 200, None, None
    try:
        status = await asyncio.wait_for(send_post(s.client, s._direct, s.url, s.headers, data, ctx, s.target.follow),
                                        s.target.timeout_s)
    except asyncio.TimeoutError:
        kind, message = "timeout", f"no end within {s.target.timeout_s:g} s (target.preflight_timeout_s)"
    except Exception as exc:  # noqa: BLE001 - the transport's faults (and a bug of ours) as a run counts them
        kind, message = error_kind(exc)
        status = getattr(exc, "status", 0)  # a redirect's
    t_done_ns = time.monotonic_ns()
    record, chunks = reader.tracker.finish(t_done_ns, status, kind, message)
    s.heads.append(response_head(bytes(ctx.raw or b"")))
    s.versions.append(ctx.http_version)
    claimed_output, claimed_prompt = reader.tracker.claimed  # as reported: judged by check's own rules
    return Probe(status=record.http_status if kind is None or status != 200 else 0,
                 error=clip(s.target.redact(record.error_message) or "", 200) if record.error_kind else None,
                 t_sent_ns=ctx.t_sent_ns or t_done_ns, t_done_ns=t_done_ns, t_first_event_ns=reader.first_event_ns,
                 first_event_text=reader.first_event_text, content_ns=tuple(c.t_ns for c in chunks),
                 max_tokens=output_tokens, completion_tokens=claimed_output,
                 prompt_tokens=claimed_prompt,
                 cached_tokens=record.cached_tokens, finish_reason=record.finish_reason,
                 text=reader.tracker.answer, prompt_counted=counted, usage_rejected=record.usage_rejected,
                 after_done=reader.tracker.after_done)


async def prompt_text(counter: TokenCounter, tokens: int, salt: str, fit_: LinearFit,
                      at_most: bool = False) -> tuple[str, int]:
    """A prompt opening with ``salt`` of about ``tokens`` tokens as ``counter`` counts it (``at_most``: never
    more): (text, its count). A few counts: the fit's guess, then nudged by whole words."""
    words = fit_.words_for(tokens)
    pool = filler(words + words // 2 + 64, random.Random(salt)).split()
    text, n, close = salt, 0, max(2, tokens // 200)
    for _ in range(8):
        words = max(0, min(words, len(pool)))
        text = " ".join([salt, *pool[:words]])
        n = await counter.count(None, text)
        off = tokens - n
        if 0 <= off <= close or (not at_most and -close <= off < 0):
            break
        step = off / fit_.tokens_per_word
        words += math.floor(step) if off < 0 else max(1, round(step))
    return text, n


async def try_prompt(s: Session, counter: TokenCounter, fit_: LinearFit, tokens: int,
                     at_most: bool) -> PromptTry:
    """One request with a prompt of ``tokens`` and max_tokens 1: accepted, refused (4xx) or failed."""
    text, n = await prompt_text(counter, tokens, f"check {random.getrandbits(40):010x}:", fit_, at_most)
    probe = await stream_probe(s, text, 1, n)
    accepted = probe.error is None and probe.status == 200
    return PromptTry(n, probe.status, accepted, probe.prompt_tokens, None if accepted else clip(probe.error or "", 160))


def _refused(t: PromptTry) -> bool:
    return 400 <= t.status < 500 and t.status not in (401, 403, 404, 429)


async def search_largest(s: Session, counter: TokenCounter, fit_: LinearFit,
                         known_ok: int) -> tuple[list[PromptTry], str | None]:
    """Double from ``SEARCH_START_TOKENS`` until refused (4xx), then halve the gap; bounded by the cap, the
    request count and the time budget. The tries, and why the search stopped early (None: it did not)."""
    deadline = time.monotonic() + SEARCH_BUDGET_S
    tries: list[PromptTry] = []
    lo, hi, n = known_ok, None, max(SEARCH_START_TOKENS, known_ok * 2)
    while len(tries) < SEARCH_REQUESTS:
        if time.monotonic() > deadline:
            return tries, f"the time budget ({SEARCH_BUDGET_S:g} s) ran out"
        t = await try_prompt(s, counter, fit_, n, at_most=True)
        tries.append(t)
        if t.accepted:
            lo = max(lo, t.tokens)
        elif _refused(t):
            hi = t.tokens if hi is None else min(hi, t.tokens)
        else:
            return tries, f"HTTP {t.status}: {t.message}" if t.status else str(t.message)
        if hi is None and t.accepted and n >= PROMPT_CAP_TOKENS:
            return tries, None
        if hi is not None and hi - lo <= max(64, lo // 20):
            return tries, None
        n = min(PROMPT_CAP_TOKENS, lo * 2) if hi is None else (lo + hi) // 2
    return tries, f"after {SEARCH_REQUESTS} requests"


async def confirm_advertised(s: Session, counter: TokenCounter, fit_: LinearFit, advertised: int,
                             exact: bool) -> tuple[list[PromptTry], str | None]:
    """A prompt just under ``advertised`` (less max_tokens 1), then one just over it, within the search's time
    budget (a long prompt's prefill on a slow server); the tries, and why it stopped early (None: it did not)."""
    margin = 8 if exact else max(8, advertised // 30)
    tries: list[PromptTry] = []

    async def both() -> None:
        tries.append(await try_prompt(s, counter, fit_, max(1, advertised - 1 - margin), at_most=True))
        tries.append(await try_prompt(s, counter, fit_, advertised + margin, at_most=False))
    try:
        await asyncio.wait_for(both(), SEARCH_BUDGET_S)
    except asyncio.TimeoutError:
        return tries, f"the time budget ({SEARCH_BUDGET_S:g} s) ran out"
    return tries, None


LENGTH_KEYS = ("max_model_len", "context_length", "context_window", "max_context_length", "max_input_tokens")


def advertised_length(models: Any, model: str) -> int | None:
    """The context length /models gives for ``model`` (vLLM's max_model_len and its cousins), if any."""
    entries = models.get("data") if isinstance(models, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            for key in LENGTH_KEYS:
                value = entry.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return None
