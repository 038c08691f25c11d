"""Ground truth: every engine step and every emitted token, as JSON lines.

Lines (all instants are ``time.monotonic_ns()``, the same clock clients on this machine read):
- ``{"type": "engine", "engine", "reserves_kv"}`` first, once: whose scheduler ran (``EngineConfig.engine``) and
  whether it holds a request's whole context from admission and never preempts (``reserves_kv``: llamacpp, tgi;
  on those a wait on a full KV cache is the admission queue, engine.py's docstring);
- ``{"type": "request", "id", "t_arrival_ns", "prompt_tokens", "max_tokens", "stop_after", "effort",
  "reasoning_tokens", "tool_tokens", "network_delay_ms"}`` on arrival (``effort``: the reasoning effort it was
  served with, null: no reasoning; the planned reasoning and tool-call tokens, ``reasoning.py``;
  ``network_delay_ms``: how long ``faults.network_delay_ms`` held it in front of the server, 0 for none — its
  first byte reached the host that much before ``t_arrival_ns``, which is when the server got it, and its
  response headers left no earlier than ``t_arrival_ns``);
- ``{"type": "step", "step", "t_start_ns", "t_end_ns", "prefill": [[id, tokens, start], ...], "decode": [id, ...],
  "preempted": [id, ...], "stall_ms", "kv_usage", "tokens": [[id, index, t_write_ns], ...]}`` — ``t_end_ns`` is
  the modelled emission time of every token the step generated, ``t_write_ns`` when its bytes actually went to
  the socket (later than ``t_end_ns`` for tokens held back by ``max_chunk_tokens`` coalescing); ``kv_usage``:
  KV tokens held / ``kv_cache_tokens`` after the step (finished requests' KV freed; what llamacpp and tgi
  reserved at admission counts as held), 4 decimals;
- ``{"type": "finish", "id", "t_ns", "reason", "output_tokens", "preemptions", "cached_tokens",
  "reasoning_tokens", "answer_tokens", "tool_tokens", "tool_calls", "first_answer_index"}`` (``reason``:
  ``length`` or ``stop``; ``error`` with ``status`` (500, 429) for an injected refusal, answered at arrival
  with no step, after a request line of its own with ``stop_after`` 0; ``disconnect`` for an injected cut
  mid-stream, at the cut; a request whose client went away has no finish line. ``cached_tokens``:
  prompt tokens the prefix cache held at the request's first admission, 0 with caching off; ``answer_tokens`` =
  ``output_tokens - reasoning_tokens``, tool-call tokens included; ``first_answer_index``: the index of the
  first token after the reasoning, null when none was generated: the step event's ``tokens`` entry for
  ``[id, first_answer_index, t_write_ns]`` is when the first answer token was written);
- ``{"type": "client_block", "t_start_ns", "t_end_ns"}``: not the simulator's own: loadgen appends one per block
  of its own event loop (``target.simulator.faults.client_block_ms``, loadgen/run/client_faults.py) after the
  simulator stopped; the window the client read nothing and sent nothing (``truth_causes``' ``hogs_ns``).

A 400 (a request the server cannot take) is not traced. A preempted request's wait is in the steps: it is in
``preempted`` of the step that evicted it and in ``prefill`` again (``start`` 0) when it is readmitted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from .config import EngineConfig


def engine_event(cfg: EngineConfig) -> dict[str, Any]:
    """The trace's first line: the engine's scheduler and whether it reserves KV at admission."""
    return {"type": "engine", "engine": cfg.engine, "reserves_kv": cfg.reserves_kv}


class TraceWriter:
    """Buffers lines in memory (``events``) and/or appends them to a file, flushed every ``flush_every`` lines."""

    def __init__(self, path: Path | None = None, keep_in_memory: bool = False, flush_every: int = 64) -> None:
        self._file: IO[str] | None = open(path, "w", encoding="utf-8") if path else None
        self.events: list[dict[str, Any]] | None = [] if keep_in_memory else None
        self._flush_every = flush_every
        self._pending = 0

    def write(self, event: dict[str, Any]) -> None:
        if self.events is not None:
            self.events.append(event)
        if self._file is not None:
            self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
            self._pending += 1
            if self._pending >= self._flush_every:
                self.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._pending = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_trace(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
