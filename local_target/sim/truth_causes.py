"""The true cause of every request that missed its limits, from the simulator's trace (``trace.py``): the same
decision order as loadgen's SLO-miss ledger (its docs/causes.md), but on the engine's exact facts instead of
the evidence a client sees. Pure, stdlib only; it reads the real-time simulator's trace file
(``read_trace``) and a virtual-time replay's trace (``loadgen/advise/replay_observe.py``) alike.

The facts, per request (``id``: the engine's request id):
- **server_error**: it was answered with an injected error (finish ``reason`` ``error``), or its record failed
  other than by a connect error (``network``) or being cancelled at the run's end (not judged);
- **network**: ``network_delay_ms``, the time it was held in front of the server (request event);
- **client_lag**: its send lag (``t_sent − t_intended``, from its record) less the part the in-flight cap held
  it (a wait: ``max_in_flight``, ``flights_ns``), and the time loadgen's loop was
  blocked (``hogs_ns``) between the server writing a token and loadgen reading it;
- **own prefill**: the engine's time to prefill its prompt (less what the prefix cache held) alone, from the
  cost model the caller passes (``prefill_ms``), else its share of each step that held its prompt's prefill
  since its last preemption (a step's duration × its chunk's tokens / the step's tokens);
- **wait** (``queueing``): the time from its arrival to its first token at the engine beyond its own prefill;
  **preemption** when it was preempted before its first token or any step while it waited to be admitted left
  the KV cache at least ``KV_FULL`` full — but not on an engine that reserves a request's KV at admission (the
  trace's engine line ``reserves_kv``: llama.cpp, TGI): there nothing is preempted and a full cache is the
  admission queue, so such a wait is queueing;
- a gap between two of its tokens: **client_lag** when the loop's blocking makes up the excess over the limit;
  **preemption** when it was preempted in the gap; **prefill** when another request's long prompt
  (>= ``long_prompt_tokens``) was prefilled in the gap's steps for more than ``min_gap_ms`` (the rule of
  tests/ground_truth.py); **prefill_burst** when three or more other requests got their first token in it (a
  batch of short prefills: TGI and SGLang pause the decodes for it); else **load** (decode steps only).

Which requests missed, and on which metric, is decided from their records as loadgen measures them (``ttft_ms``
from the intended send, ``e2e_ms``, ``tpot_ms``, ``itl_ms``/``chunk_gap_ms`` per gap; the decisive metric is the
largest excess over its limit; an error is always decisive).
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

KV_FULL = 0.95
STALL_FACTOR = 4.0  # a gap this many times the request's median is a stall (loadgen's spike_factor)
BURST_FIRSTS = 3  # this many other requests' first tokens in a gap: a burst of prefills paused it
MS = 1e6
GAP_METRICS = ("itl_ms", "chunk_gap_ms")


@dataclass
class _Facts:
    """One request's engine facts from the trace."""
    arrival_ns: int = 0
    delay_ms: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # found in the prefix cache at its first admission (finish event)
    error: bool = False
    writes: dict[int, int] = field(default_factory=dict)  # token index → engine emission (step end)
    prefills: list[tuple[int, int, float]] = field(default_factory=list)  # (start, end, own ms) per step
    preempted_ns: list[int] = field(default_factory=list)  # ends of the steps that evicted it


@dataclass(frozen=True)
class TrueMiss:
    metric: str  # the decisive one ("error" for a failed request)
    cause: str
    why: str


def true_causes(trace_events: list[dict[str, Any]], records_by_id: dict[str, dict[str, Any]],
                limits_ms: dict[str, float], hogs_ns: list[tuple[int, int]] | None = None,
                long_prompt_tokens: int = 4000, min_gap_ms: float = 50.0,
                prefill_ms: Callable[[int], float] | None = None, max_in_flight: int | None = None,
                flights_ns: list[tuple[int, int]] | None = None) -> dict[str, str]:
    """engine id → the true cause of each request in ``records_by_id`` that missed a limit (``true_misses``)."""
    misses = true_misses(trace_events, records_by_id, limits_ms, hogs_ns, long_prompt_tokens, min_gap_ms,
                         prefill_ms, max_in_flight, flights_ns)
    return {rid: m.cause for rid, m in misses.items()}


def true_misses(trace_events: list[dict[str, Any]], records_by_id: dict[str, dict[str, Any]],
                limits_ms: dict[str, float], hogs_ns: list[tuple[int, int]] | None = None,
                long_prompt_tokens: int = 4000, min_gap_ms: float = 50.0,
                prefill_ms: Callable[[int], float] | None = None, max_in_flight: int | None = None,
                flights_ns: list[tuple[int, int]] | None = None) -> dict[str, TrueMiss]:
    """``records_by_id``: engine id → the request's record fields (``t_intended_ns``, ``t_sent_ns``,
    ``t_first_token_ns``, ``t_done_ns``, ``output_tokens``, ``error_kind``, ``class_name``) and ``tokens_ns``,
    the instants loadgen read its tokens, one per token (default: the trace's emissions); only these requests
    are judged. ``limits_ms``:
    metric → limit. ``hogs_ns``: the windows loadgen's loop was blocked, on the trace's clock. ``prefill_ms``:
    the engine's time to prefill n prompt tokens alone (``costmodel.prefill_alone_ms`` with the run's config),
    which a request's own prefill is (its prompt less what the prefix cache held); None: its share of the steps
    that held its prefill (their duration × its tokens / theirs), which a long prompt's quadratic attention
    makes an underestimate. ``max_in_flight``: loadgen's in-flight cap, ``flights_ns``: (t_sent_ns, t_done_ns)
    of every request loadgen sent (warm-up included): a send due while the cap was full waited for the server
    until the completion that freed its slot (``_cap_held_ms``), a wait, not the client's lag."""
    world = _World(trace_events, hogs_ns or [], long_prompt_tokens, min_gap_ms)
    world.prefill_ms = prefill_ms
    world.cap = max_in_flight
    world.sends = sorted(t for t, _ in flights_ns or [])
    world.dones = sorted(t for _, t in flights_ns or [])
    world.class_base = world.baselines(records_by_id)
    out = {}
    for rid, rec in records_by_id.items():
        miss = world.judge(rid, rec, limits_ms)
        if miss is not None:
            out[rid] = miss
    return out


class _World:
    def __init__(self, events: list[dict[str, Any]], hogs_ns: list[tuple[int, int]], long_prompt_tokens: int,
                 min_gap_ms: float) -> None:
        self.hogs, self.long, self.min_gap_ms = sorted(hogs_ns), long_prompt_tokens, min_gap_ms
        self.class_base: dict[str, float] = {}  # per class: its median gap at the engine (``baselines``)
        self.prefill_ms: Callable[[int], float] | None = None
        self.cap: int | None = None
        self.sends: list[int] = []
        self.dones: list[int] = []
        self.facts: dict[str, _Facts] = {}
        self.reserves_kv = any(e["type"] == "engine" and e.get("reserves_kv") for e in events)
        self.steps = sorted((e for e in events if e["type"] == "step"), key=lambda e: e["t_end_ns"])
        self.ends = [s["t_end_ns"] for s in self.steps]
        for e in events:
            if e["type"] == "request":
                f = self.facts.setdefault(e["id"], _Facts())
                f.arrival_ns, f.prompt_tokens = e["t_arrival_ns"], e["prompt_tokens"]
                f.delay_ms = float(e.get("network_delay_ms") or 0.0)
            elif e["type"] == "finish":
                f = self.facts.setdefault(e["id"], _Facts())
                f.error, f.cached_tokens = e.get("reason") == "error", int(e.get("cached_tokens") or 0)
        for s in self.steps:
            self._step(s)
        self.firsts = sorted(f.writes[0] for f in self.facts.values() if 0 in f.writes)  # first tokens' emissions

    def baselines(self, records_by_id: dict[str, dict[str, Any]]) -> dict[str, float]:
        """Per class: the median gap between the engine's emissions of its requests' tokens (ms)."""
        gaps: dict[str, list[int]] = {}
        for rid, rec in records_by_id.items():
            w = self.facts.get(rid, _Facts()).writes
            gaps.setdefault(rec.get("class_name") or "", []).extend(
                w[i] - w[i - 1] for i in range(1, len(w)) if i in w and i - 1 in w)
        return {c: statistics.median(g) / MS for c, g in gaps.items() if g}

    def _step(self, s: dict[str, Any]) -> None:
        dur_ns = s["t_end_ns"] - s["t_start_ns"]
        size = sum(tokens for _, tokens, _ in s["prefill"]) + len(s["decode"])
        for rid, tokens, _ in s["prefill"]:
            share = dur_ns * tokens / size / MS if size else 0.0
            self.facts.setdefault(rid, _Facts()).prefills.append((s["t_start_ns"], s["t_end_ns"], share))
        for rid in s["preempted"]:
            self.facts.setdefault(rid, _Facts()).preempted_ns.append(s["t_end_ns"])
        for rid, index, _ in s["tokens"]:
            self.facts.setdefault(rid, _Facts()).writes.setdefault(index, s["t_end_ns"])

    # ---- one request ---------------------------------------------------------------------------------
    def judge(self, rid: str, rec: dict[str, Any], limits: dict[str, float]) -> TrueMiss | None:
        f = self.facts.get(rid, _Facts())
        kind = rec.get("error_kind")
        if kind == "cancelled":
            return None
        if f.error or kind is not None:
            cause = "network" if kind == "connect" else "server_error"
            return TrueMiss("error", cause, f"failed ({kind or 'injected error'})")
        reads = list(rec.get("tokens_ns") or [f.writes[i] for i in sorted(f.writes)])
        metric, x, value = _decisive(rec, reads, limits)
        if metric is None:
            return None
        if not reads:  # finished without a token: nothing of the engine's to weigh
            return TrueMiss(metric, "unknown", "no token was read")
        if metric == "ttft_ms":
            return self._ttft(f, rec, reads, limits[metric], x)
        if metric in GAP_METRICS:
            return self._gap(rid, f, reads, value, x)
        if metric == "tpot_ms":
            return self._tpot(rid, f, reads, x, self.class_base.get(rec.get("class_name") or "", 0.0))
        return self._e2e(rid, f, rec, reads, limits[metric], x)

    def _ttft_parts(self, f: _Facts, rec: dict[str, Any], reads: list[int]) -> dict[str, float]:
        first_write = f.writes.get(0, reads[0])
        last_evict = max((t for t in f.preempted_ns if t <= first_write), default=0)
        own = (self.prefill_ms(max(f.prompt_tokens - f.cached_tokens, 1)) if self.prefill_ms is not None else
               sum(ms for a, b, ms in f.prefills if a >= last_evict and b <= first_write))
        capped = self._cap_held_ms(rec["t_intended_ns"], rec["t_sent_ns"])
        wait = (first_write - f.arrival_ns) / MS - own + capped
        return {"client_lag": (rec["t_sent_ns"] - rec["t_intended_ns"]) / MS - capped
                + self._held_ms(first_write, reads[0]), "network": f.delay_ms, "wait": wait, "own_prompt": own}

    def _cap_held_ms(self, due: int, sent: int) -> float:
        """ms of its send lag the in-flight cap held it: ``cap`` requests in flight at its due time (sent by
        then, not done), held until the last completion before it went out (the slot it took)."""
        if self.cap is None or sent <= due:
            return 0.0
        in_flight = bisect.bisect_right(self.sends, due) - bisect.bisect_right(self.dones, due)
        k = bisect.bisect_right(self.dones, sent)
        return max(0, min(self.dones[k - 1], sent) - due) / MS if in_flight >= self.cap and k else 0.0

    def _ttft(self, f: _Facts, rec: dict[str, Any], reads: list[int], limit: float, x: float) -> TrueMiss:
        parts = self._ttft_parts(f, rec, reads)
        why = ", ".join(f"{k} {v:.0f} ms" for k, v in parts.items()) + f" (excess {x:.0f} ms)"
        parts["wait"] = max(parts["wait"], 0.0)
        if parts["own_prompt"] >= limit:
            return TrueMiss("ttft_ms", "own_prompt", why)
        for name in ("client_lag", "network", "wait"):
            if parts[name] >= x:
                return TrueMiss("ttft_ms", self._waited(f) if name == "wait" else name, why)
        name = max(parts, key=lambda k: parts[k])
        if parts[name] >= 0.5 * x:
            return TrueMiss("ttft_ms", self._waited(f) if name == "wait" else name, why)
        return TrueMiss("ttft_ms", "unknown", why)

    def _waited(self, f: _Facts) -> str:
        """preemption when it was evicted before its first token or waited while the KV cache was full (on an
        engine that preempts: one that reserves KV at admission queues instead)."""
        first_write = f.writes.get(0)
        if any(first_write is None or t <= first_write for t in f.preempted_ns):
            return "preemption"
        if self.reserves_kv:
            return "queueing"
        admitted = min((a for a, _, _ in f.prefills), default=first_write or 0)
        full = any(s.get("kv_usage") is not None and s["kv_usage"] >= KV_FULL and s["t_start_ns"] < admitted
                   for s in self._steps_in(f.arrival_ns, max(admitted, f.arrival_ns) + 1))
        return "preemption" if full else "queueing"

    def _gap_cause(self, rid: str, f: _Facts, reads: list[int], i: int, x: float) -> tuple[str, float]:
        """The cause of the gap before token ``i`` and its client part (ms)."""
        client = (self._held_ms(f.writes.get(i, reads[i]), reads[i])
                  - self._held_ms(f.writes.get(i - 1, reads[i - 1]), reads[i - 1]))
        if client >= x:
            return "client_lag", client
        a, b = f.writes.get(i - 1, reads[i - 1]), f.writes.get(i, reads[i])
        if any(a < t <= b for t in f.preempted_ns):
            return "preemption", client
        held: dict[str, float] = {}
        for s in self._steps_in(a, b):
            for c, _, _ in s["prefill"]:
                if c != rid and self.facts.get(c, _Facts()).prompt_tokens >= self.long:
                    held[c] = held.get(c, 0.0) + (s["t_end_ns"] - s["t_start_ns"]) / MS
        if any(ms > self.min_gap_ms for ms in held.values()):
            return "prefill", client
        own_first = a < f.writes.get(0, a) <= b
        firsts = bisect.bisect_right(self.firsts, b) - bisect.bisect_right(self.firsts, a) - own_first
        if firsts >= BURST_FIRSTS:
            return "prefill_burst", client
        return "load", client

    def _gap(self, rid: str, f: _Facts, reads: list[int], value: float, x: float) -> TrueMiss:
        gaps = [(reads[i] - reads[i - 1]) / MS for i in range(1, len(reads))]
        i = 1 + max(range(len(gaps)), key=lambda k: gaps[k])
        cause, client = self._gap_cause(rid, f, reads, i, x)
        return TrueMiss("itl_ms", cause, f"gap {value:.0f} ms before token {i}, client {client:.0f} ms")

    def _stall_excess(self, rid: str, f: _Facts, reads: list[int], base: float) -> dict[str, float]:
        """ms beyond its class's median gap (``base``) of its stalls (gaps over ``STALL_FACTOR`` of it and
        ``min_gap_ms``, as loadgen's stall threshold), summed per gap cause (the engine's own pace excluded)."""
        gaps = [(reads[i] - reads[i - 1]) / MS for i in range(1, len(reads))]
        out: dict[str, float] = {}
        for i, gap in enumerate(gaps, start=1):
            if gap > max(STALL_FACTOR * base, self.min_gap_ms):
                cause, _ = self._gap_cause(rid, f, reads, i, gap - base)
                if cause != "load":
                    out[cause] = out.get(cause, 0.0) + gap - base
        return out

    def _tpot(self, rid: str, f: _Facts, reads: list[int], x: float, base: float) -> TrueMiss:
        n, stalls = len(reads), self._stall_excess(rid, f, reads, base)
        per_token = {k: v / (n - 1) for k, v in stalls.items()}
        if per_token and max(per_token.values()) >= 0.5 * x:
            cause = max(per_token, key=lambda k: per_token[k])
            return TrueMiss("tpot_ms", cause, f"stall excess per token {per_token[cause]:.1f} ms ({cause})")
        return TrueMiss("tpot_ms", "load", f"no stall makes up half the excess {x:.1f} ms: every step slow")

    def _e2e(self, rid: str, f: _Facts, rec: dict[str, Any], reads: list[int], limit: float,
             x: float) -> TrueMiss:
        parts, base = self._ttft_parts(f, rec, reads), self.class_base.get(rec.get("class_name") or "", 0.0)
        n, stalls = len(reads), self._stall_excess(rid, f, reads, base)
        if parts["own_prompt"] + (n - 1) * base >= limit:
            return TrueMiss("e2e_ms", "own_prompt", "own prefill and decode at the engine's pace exceed the limit")
        decode_ms = (f.writes.get(n - 1, reads[-1]) - f.writes.get(0, reads[0])) / MS
        comps = {"client_lag": parts["client_lag"] + stalls.pop("client_lag", 0.0), "network": parts["network"],
                 self._waited(f): max(parts["wait"], 0.0), **stalls,
                 "load": decode_ms - (n - 1) * base - sum(stalls.values())}
        name = max(comps, key=lambda k: comps[k])
        why = ", ".join(f"{k} {v:.0f} ms" for k, v in comps.items()) + f" (excess {x:.0f} ms)"
        return TrueMiss("e2e_ms", name if comps[name] >= 0.5 * x else "unknown", why)

    def _steps_in(self, a_ns: int, b_ns: int) -> list[dict[str, Any]]:
        """The steps that ended in (a_ns, b_ns]."""
        return self.steps[bisect.bisect_right(self.ends, a_ns):bisect.bisect_right(self.ends, b_ns)]

    def _held_ms(self, t_write: int, t_read: int) -> float:
        """ms of [t_write, t_read] during which loadgen's loop was blocked."""
        return sum(max(0, min(t_read, b) - max(t_write, a)) for a, b in self.hogs) / MS


def _decisive(rec: dict[str, Any], reads: list[int], limits: dict[str, float]) -> tuple[str | None, float, float]:
    """(the decisive metric, its excess in ms, its value) or (None, 0, 0) when no limit was missed."""
    values: dict[str, float] = {}
    if reads:
        values["ttft_ms"] = (reads[0] - rec["t_intended_ns"]) / MS
    values["e2e_ms"] = (rec["t_done_ns"] - rec["t_intended_ns"]) / MS
    if len(reads) > 1:
        values["tpot_ms"] = (reads[-1] - reads[0]) / MS / (len(reads) - 1)
        worst = max((reads[i] - reads[i - 1]) / MS for i in range(1, len(reads)))
        values["itl_ms"] = values["chunk_gap_ms"] = worst
    over = {k: (v - limits[k]) / limits[k] for k, v in values.items() if k in limits and v > limits[k]}
    if not over:
        return None, 0.0, 0.0
    metric = max(over, key=lambda k: over[k])
    return metric, values[metric] - limits[metric], values[metric]
