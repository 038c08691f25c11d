"""A minimal timestamping SSE reader for the simulator's tests (loadgen's own core comes later)."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Stream:
    t_sent_ns: int
    status: int = 0
    events: list[tuple[int, Any]] = field(default_factory=list)  # (t_received_ns, parsed JSON or raw str)
    error_body: Any = None

    @property
    def content_times(self) -> list[int]:
        """Receive time of every chunk carrying generated text."""
        return [t for t, e in self.events if isinstance(e, dict) and _content(e)]

    @property
    def text(self) -> str:
        return "".join(_content(e) for _, e in self.events if isinstance(e, dict))

    @property
    def done(self) -> bool:
        return any(e == "[DONE]" for _, e in self.events)

    @property
    def request_id(self) -> str:
        return next(e["id"] for _, e in self.events if isinstance(e, dict))


def _content(event: dict[str, Any]) -> str:
    choices = event.get("choices") or [{}]
    choice = choices[0]
    return choice.get("delta", {}).get("content") or choice.get("text") or ""


def chat_body(model: str, prompt_words: int, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A chat request whose content is ``prompt_words`` single-token words."""
    content = " ".join(f"w{i}" for i in range(prompt_words))
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True, **extra}


async def stream(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                 first_tokens: asyncio.Event | None = None, after_tokens: int = 1) -> Stream:
    """POST and read the SSE stream, stamping every event; sets ``first_tokens`` after ``after_tokens``."""
    out = Stream(time.monotonic_ns())
    async with client.stream("POST", url, json=body) as resp:
        out.status = resp.status_code
        if resp.status_code != 200:
            out.error_body = json.loads(await resp.aread())
            return out
        try:
            async for line in resp.aiter_lines():
                now = time.monotonic_ns()
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                try:
                    out.events.append((now, "[DONE]" if data == "[DONE]" else json.loads(data)))
                except ValueError:
                    out.events.append((now, data))
                if first_tokens is not None and len(out.content_times) >= after_tokens:
                    first_tokens.set()
        except httpx.RemoteProtocolError:
            out.events.append((time.monotonic_ns(), "<disconnected>"))
    return out


def run_timed(coro: Any) -> Any:
    """``asyncio.run`` with garbage collection paused, as loadgen's engine does while it sends: by the time
    the timing tests run, this pytest process holds a large heap (polars, altair, playwright...) whose full
    collections took up to 52 ms here (measured with gc.callbacks), and a clean-clone CI run saw one 122 ms
    victim gap outside the aggressor's step: a pause of the reader is not a stall of the simulator."""
    gc.collect()
    gc.disable()
    try:
        return asyncio.run(coro)
    finally:
        gc.enable()
