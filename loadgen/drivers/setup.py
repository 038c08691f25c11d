"""The asyncio engine's HTTP client (TLS included) and configuration for a scenario and its resolved target: one
place for ``loadgen run`` (runner.py) and the Locust driver's engine thread (engine_thread.py)."""

from __future__ import annotations

import ssl

import httpx

from loadgen.plan.scenario import Scenario
from loadgen.run.target import ResolvedTarget, TargetError
from loadgen.drivers.asyncio_engine import EngineConfig
from loadgen.drivers.lean_transport import LeanTransport

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


def open_client(scenario: Scenario, base_url: str) -> httpx.AsyncClient:
    """A client on the lean transport, for http:// and https:// alike (TLS by ``target.tls``)."""
    room = scenario.load.max_in_flight + 8
    t = scenario.target
    transport = LeanTransport(connect_timeout_s=t.connect_timeout_s, ssl_context=ssl_context(scenario))
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=room, max_keepalive_connections=room),
                               timeout=httpx.Timeout(connect=t.connect_timeout_s, read=None, write=30.0, pool=None),
                               transport=transport)
    return client


def engine_config(scenario: Scenario, target: ResolvedTarget) -> EngineConfig:
    s, load = scenario, scenario.load
    path = "/chat/completions" if s.target.api == "chat" else "/completions"
    return EngineConfig(url=target.base_url + path, headers={**target.headers, "content-type": "application/json"},
                        ttft_timeout_s=s.target.ttft_timeout_s, idle_timeout_s=s.target.idle_timeout_s,
                        request_timeout_s=s.target.request_timeout_s, drain_timeout_s=load.drain_timeout_s,
                        max_in_flight=load.max_in_flight, duration_s=load.duration_s, warmup_s=load.warmup_s,
                        concurrency=load.concurrency, send_ahead_ms=SEND_AHEAD_MS,
                        max_event_bytes=s.target.max_event_bytes)
