"""One preparation path for every driver: the HTTP client (TLS included), the resolved target (model, engine,
tokenize endpoint), the prompt factory, the engine's configuration and each request's body. ``loadgen run``
(runner.py) and the Locust driver's engine thread (drivers/engine_thread.py, handed a ``Preparation``) both
start here."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import httpx
from rich.console import Console

from loadgen.core.apis import PATHS
from loadgen.drivers.engine_config import EngineConfig
from loadgen.drivers.lean_transport import LeanTransport
from loadgen.drivers.sessions import CallResult
from loadgen.drivers.proxy import Proxy, ProxyError, proxy_for
from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import Plan, PlannedRequest
from loadgen.plan.session_bodies import Transcript, new_messages, session_body
from loadgen.plan.workload import History, Prompt, PromptFactory, request_body
from loadgen.report.banner import banner_lines
from loadgen.run.target import ResolvedTarget, TargetError, auth_headers, resolve, token_counter

SEND_AHEAD_MS = 1.0  # with the lean transport: sends start this early and are held until their time


def ssl_context(scenario: Scenario) -> ssl.SSLContext | None:
    """The TLS settings of an https:// target (None for http://); a bad certificate file is a TargetError."""
    tls = scenario.target.tls
    if not scenario.target.base_url.startswith("https://"):
        return None
    try:
        ctx = ssl.create_default_context(cafile=str(tls.ca_bundle) if tls.ca_bundle else None)
        if not tls.verify:
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if tls.client_cert is not None:
            ctx.load_cert_chain(tls.client_cert, tls.client_key)
    except (ssl.SSLError, OSError) as exc:
        raise TargetError(f"target.tls: cannot load the certificate files: {exc}") from None
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def target_proxy(scenario: Scenario, base_url: str) -> Proxy | None:
    """The environment's proxy for the target (drivers/proxy.py; never for the embedded simulator); a proxy
    setting loadgen cannot use is a TargetError naming the variable (exit 2, before anything is sent)."""
    if scenario.target.embedded or base_url != scenario.target.base_url:  # the simulator's own URL
        return None
    try:
        return proxy_for(base_url)
    except ProxyError as exc:
        raise TargetError(str(exc)) from None


def note_proxy(target: ResolvedTarget, proxy: Proxy | None) -> None:
    """The target goes through ``proxy``: kept for the scraper, and said in the notes."""
    target.proxy = proxy
    if proxy is not None:
        target.notes.append(f"requests went through the proxy {proxy.url} ({proxy.variable}); the figures "
                            "include it")


def open_client(scenario: Scenario, base_url: str) -> httpx.AsyncClient:
    """A client on the lean transport, for http:// and https:// alike (TLS by ``target.tls``), through the
    environment's proxy where it names one for the target."""
    room = scenario.load.max_in_flight + 8
    t = scenario.target
    target_proxy(scenario, base_url)  # a proxy setting that cannot be used: TargetError before anything is sent
    transport = LeanTransport(connect_timeout_s=t.connect_timeout_s, ssl_context=ssl_context(scenario),
                              use_proxy_env=not t.embedded)
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=room, max_keepalive_connections=room),
                               timeout=httpx.Timeout(connect=t.connect_timeout_s, read=None, write=30.0, pool=None),
                               transport=transport)
    return client


def engine_config(scenario: Scenario, target: ResolvedTarget) -> EngineConfig:
    s, load = scenario, scenario.load
    return EngineConfig(url=target.base_url + PATHS[s.target.api], api=s.target.api,
                        headers={**target.headers, "content-type": "application/json"},
                        ttft_timeout_s=s.target.ttft_timeout_s, idle_timeout_s=s.target.idle_timeout_s,
                        request_timeout_s=s.target.request_timeout_s, drain_timeout_s=load.drain_timeout_s,
                        max_in_flight=load.max_in_flight, duration_s=load.duration_s, warmup_s=load.warmup_s,
                        concurrency=load.concurrency, send_ahead_ms=SEND_AHEAD_MS,
                        max_event_bytes=s.target.max_event_bytes, max_rate_per_s=load.max_rate_per_s,
                        follow_redirects=s.target.follow_redirects)


@dataclass
class Prepared:
    """A run ready to send: its resolved target and prompt factory."""

    scenario: Scenario
    plan: Plan
    target: ResolvedTarget
    factory: PromptFactory

    def engine_config(self) -> EngineConfig:
        return engine_config(self.scenario, self.target)

    async def body(self, req: PlannedRequest, prompt: Prompt | None = None) -> dict[str, Any]:
        """The request's JSON body (its prompt built now unless given)."""
        return (await self.turn(req, [], prompt))[0]

    async def turn(self, req: PlannedRequest, history: History,
                   prompt: Prompt | None = None) -> tuple[dict[str, Any], str]:
        """A conversation's turn: its body (the history, then its new message) and that new message."""
        prompt = prompt or await self.factory.build(req)
        body = request_body(self.scenario, self.target.model, self.plan.class_of(req.class_name), prompt,
                            req.output_tokens, self.target.continuous_usage, history)
        return body, prompt.user

    async def call(self, req: PlannedRequest, transcript: Transcript, parents: Sequence[CallResult],
                   prompt: Prompt | None = None) -> tuple[dict[str, Any], Transcript]:
        """A session call: its body (the system prompt, its context's ``transcript``, then its new messages) and
        those new messages. ``parents``: every parent's result; the context's tool calls get their results, and
        a call that extends a context carries the answers of its other parents (the sub-agents it joins)."""
        prompt = prompt or await self.factory.build(req)
        context = next((p for p in parents if p.call == req.context), None)
        joined = [p for p in parents if p is not context] if req.context is not None else []
        new = new_messages(req, prompt, context.tool_calls if context is not None else (), joined)
        return session_body(self.scenario, self.target.model, self.plan.class_of(req.class_name), prompt,
                            transcript, new, req.output_tokens, req.tool_turn, self.target.continuous_usage), new


@dataclass
class Preparation:
    """How to prepare ``scenario`` against ``base_url``."""

    scenario: Scenario
    plan: Plan
    base_url: str
    capture: Any = None  # run/guards.Captures: failed responses as received (--capture), for the engine
    out_dir: Path | None = None  # set: the start banner is printed (stderr) once the target resolves

    def open_client(self) -> httpx.AsyncClient:
        return open_client(self.scenario, self.base_url)

    async def prepare(self, client: httpx.AsyncClient) -> Prepared:
        """Resolve the target (TargetError names what is wrong) and ready the prompt factory."""
        headers, redact = auth_headers(self.scenario)  # TargetError: an API key's variable is not set
        proxy = target_proxy(self.scenario, self.base_url)
        target = await resolve(self.scenario, client, self.base_url, headers, redact)
        note_proxy(target, proxy)
        if self.out_dir is not None:
            err = Console(stderr=True)
            for line in banner_lines(self.scenario, target, self.out_dir, err.width):
                err.print(line, highlight=False, markup=False, soft_wrap=True)
        factory = PromptFactory(self.scenario, await token_counter(self.scenario, client, target))
        await factory.prepare_classes()
        return Prepared(self.scenario, self.plan, target, factory)
