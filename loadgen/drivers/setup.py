"""The asyncio engine's HTTP client and configuration for a scenario and its resolved target: one place for
``loadgen run`` (runner.py) and the Locust driver's engine thread (engine_thread.py)."""

from __future__ import annotations

import httpx

from ..scenario import Scenario
from ..target import ResolvedTarget
from .asyncio_engine import EngineConfig
from .lean_transport import LeanTransport

SEND_AHEAD_MS = 1.0  # with the lean transport: sends start this early and are held until their time


def open_client(scenario: Scenario, base_url: str) -> tuple[httpx.AsyncClient, bool]:
    """(client, lean): the lean transport for http://, httpx's own for https://."""
    room = scenario.load.max_in_flight + 8
    lean = base_url.startswith("http://")
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=room, max_keepalive_connections=room),
                               timeout=httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None),
                               transport=LeanTransport() if lean else None)
    return client, lean


def engine_config(scenario: Scenario, target: ResolvedTarget, lean: bool) -> EngineConfig:
    s, load = scenario, scenario.load
    path = "/chat/completions" if s.target.api == "chat" else "/completions"
    return EngineConfig(url=target.base_url + path, headers={**target.headers, "content-type": "application/json"},
                        ttft_timeout_s=s.target.ttft_timeout_s, idle_timeout_s=s.target.idle_timeout_s,
                        max_in_flight=load.max_in_flight, duration_s=load.duration_s, warmup_s=load.warmup_s,
                        concurrency=load.concurrency, send_ahead_ms=SEND_AHEAD_MS if lean else 0.0)
