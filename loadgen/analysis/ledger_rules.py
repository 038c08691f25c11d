"""The SLO-miss ledger's decision order (docs/causes.md), one function per kind of miss: given one missed
request's row (its decisive metric and the evidence ``analysis/ledger.py`` gathered for it), its cause, a line of
evidence with the numbers that decided, the culprits (prefill) and the components. "Alone ≥ excess" means that
without it the request would have met its limit; where no single part is that large, the largest part decides
when it is at least half the excess, else the miss is ``unknown`` (unexplained: never a guess).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadgen.core.secrets import clip
from loadgen.core.vocabulary import CAUSES

HALF = 0.5  # the largest part decides when it is at least this share of the excess
CPU_SATURATED = 0.95  # loadgen's process busy this share of a CPU (a second's mean) or more: saturated
Row = dict[str, Any]


@dataclass
class Verdict:
    cause: str
    evidence: str
    culprits: list[int] = field(default_factory=list)
    parts: dict[str, float | None] = field(default_factory=dict)  # the components (ms) of ledger.COMPONENTS

    def __post_init__(self) -> None:
        assert self.cause in CAUSES, self.cause


def ms(value: float | None) -> str:
    return f"{value:,.0f} ms" if value is not None else "? ms"


def no_loop_note(row: Row) -> str:
    """Said where a loop lag would have mattered and none was measured (no client metrics in the run)."""
    return "" if row["client_measured"] else "; loadgen's loop lag was not measured in this run"


def error(row: Row) -> Verdict:
    """A failed request: a connect error is the network's; loadgen's own failure (``internal``: a bug in
    loadgen, exit 4) is unexplained, neither the server's nor a client lag; anything else (an HTTP status, an
    in-band error, a timeout) the server's."""
    kind, status = row["error_kind"], row["http_status"]
    said = f"{kind}" + (f" (HTTP {status})" if status else "")
    message = clip(str(row["error_message"]), 80) if row["error_message"] else ""
    if kind == "internal":
        return Verdict("unknown", "loadgen's own failure (error_kind internal: a bug in loadgen, exit 4)"
                       + (f": {message}" if message else ""))
    return Verdict("network" if kind == "connect" else "server_error", said + (f": {message}" if message else ""))


def no_answer(row: Row, limit: float) -> Verdict:
    """A request that reasoned and never answered (no answer token: a miss of ``ttft_answer_ms`` whatever the
    limit): stopped by its own ``max_tokens`` while reasoning (finish_reason ``length``) → own_prompt, its own
    budget spent before an answer, no wait of the server's; any other end → unknown (the evidence names it)."""
    reason, thought = row.get("finish_reason"), row.get("reasoning_tokens") or 0
    said = (f"no answer token: it reasoned {thought:,} of its {row['output_tokens'] or 0:,} output tokens "
            f"(finish_reason {reason or 'not given'})")
    if reason == "length":
        return Verdict("own_prompt", f"{said}: its own max_tokens ran out before an answer, over the {ms(limit)} "
                       "limit whatever the server's speed")
    return Verdict("unknown", f"{said}: a miss of the {ms(limit)} limit that no latency explains")


def with_cpu(verdict: Verdict, row: Row) -> Verdict:
    """loadgen's CPU busy share over the request (``cpu_busy``: the largest 1-s mean from its intended send to
    its end) added to a client_lag verdict's evidence, and to an unexplained one's where it was saturated. It
    decides nothing: the time loadgen lost is its send lag and its loop's lag, which are measured; a share is a
    second's mean (a 600 ms block in an idle second reads ~60 %), and a saturated second adds no lateness that
    was measured."""
    share = row.get("cpu_busy")
    if share is None or verdict.cause not in ("client_lag", "unknown"):
        return verdict
    saturated = share >= CPU_SATURATED
    if verdict.cause == "client_lag":
        said = (f"CPU saturated (loadgen's process busy {share:.0%} ≥ {CPU_SATURATED:.0%} of a CPU over it)"
                if saturated else f"loadgen's process busy {share:.0%} of a CPU at most over it")
    elif saturated:
        said = (f"loadgen's CPU was saturated ({share:.0%}) over it, but its send and loop lag do not explain the "
                "excess: not called client_lag")
    else:
        return verdict
    return Verdict(verdict.cause, f"{verdict.evidence}; {said}", verdict.culprits, verdict.parts)


def _wait_cause(row: Row) -> str:
    return "preemption" if row["pressure_first"] else "queueing"


def _wait_words(row: Row, wait: float, own: float) -> str:
    """The wait in words: the part the in-flight cap held the send (``held_ms``) named apart."""
    where = f" while the server's {row['pressure_first'].removeprefix('its ')}" if row["pressure_first"] else ""
    held = row.get("held_ms") or 0.0
    capped = (f" (of it {ms(held)} held by max_in_flight ({row['held_in_flight']} in flight) before it was sent)"
              if held > 0 else "")
    return f"waited {ms(wait)} beyond its own {ms(own)} prefill{where}{capped}"


def ttft(row: Row, value: float, limit: float, own: float) -> Verdict:
    """TTFT: its own prefill alone over the limit; else the first part alone ≥ the excess of client lag
    (send lag + loop blocked before the first token), network, the wait (preemption under server pressure,
    else queueing); else the largest part if ≥ half the excess; else unknown."""
    x = value - limit
    send, read, net = row["send_lag_ms"] or 0.0, row["read_first_ms"], row["network_ms"]
    svc = row["ttft_service_ms"] if row["ttft_service_ms"] is not None else value - send - (row.get("held_ms") or 0.0)
    held = row.get("held_ms") or 0.0  # the send lag the in-flight cap held: a wait for the server
    wait = max(0.0, svc - row["headers_late_ms"] - own - read) + held  # (the connect came before the send)
    parts: dict[str, float | None] = {"send_lag_ms": send, "read_lag_ms": read, "network_ms": net,
                                      "wait_ms": wait, "own_ms": own}
    if own >= limit:
        return Verdict("own_prompt", f"its own prefill of {row['prefilled'] or 0:,} tokens takes ≈{ms(own)}, "
                       f"over the {ms(limit)} limit by itself", parts=parts)
    client = send + read
    blocked = f"loop was blocked {ms(read)} before the first token"
    late = (f"loadgen sent it {ms(send)} late" + (f" and its {blocked}" if read > 0 else "") if send >= 0.5
            else f"loadgen's {blocked}")
    words = {"client_lag": late,
             "network": f"the transport took {ms(net)} (connect and late headers)",
             _wait_cause(row): _wait_words(row, wait, own),
             "own_prompt": f"its own prefill of {row['prefilled'] or 0:,} tokens takes ≈{ms(own)}"}
    sizes = {"client_lag": client, "network": net, _wait_cause(row): wait, "own_prompt": own}
    for cause in ("client_lag", "network", _wait_cause(row)):
        if sizes[cause] >= x:
            return Verdict(cause, f"{words[cause]} (excess {ms(x)})", parts=parts)
    return _largest(sizes, words, x, parts, row, f"TTFT {ms(value)} over {ms(limit)}")


def _largest(sizes: dict[str, float], words: dict[str, str], x: float, parts: dict[str, float | None], row: Row,
             what: str, culprits: list[int] | None = None) -> Verdict:
    """The largest part when it is at least half the excess ``x``; else unknown, with every part named."""
    cause, size = max(sizes.items(), key=lambda kv: kv[1])
    if size >= HALF * x and size > 0:
        return Verdict(cause, f"{words[cause]}: the largest part of the {ms(x)} excess",
                       culprits if cause == "prefill" and culprits else [], parts)
    named = ", ".join(f"{c} {ms(v)}" for c, v in sizes.items())
    return Verdict("unknown", f"{what}: no part explains half the {ms(x)} excess ({named}){no_loop_note(row)}",
                   parts=parts)


def gap(row: Row) -> Verdict:
    """ITL / chunk gap, on the request's worst gap over its limit: loadgen's loop blocked ≥ the gap's excess
    → client_lag (unless a culprit's prefill covers the gap's server part and the chunk ending the gap was read
    alone, not in a burst the block held: the server wrote it late; ``gap_held_ms``); the gap the
    stream's alone while the server preempted (or its KV cache was full) → preemption; else the stall
    attribution's cause for the gap (analysis/spikes.py's rule, culprits kept), with server pressure over a gap
    it cannot explain a preemption, three other streams' first tokens in it a prefill_burst, and a gap it
    cannot explain that half the batch's streams shared load (a slow engine step for all); else unknown."""
    tokens, gap_ms, limit = row["gap_tokens"], row["gap_ms"], row["limit_ms"]
    x = gap_ms - tokens * limit if row["metric"] == "itl_ms" else gap_ms - limit
    blocked, pressure, cause = row["gap_blocked_ms"], row["gap_pressure"], row["gap_cause"] or "unknown"
    if cause == "prefill" and row["gap_held_ms"] < x:  # the server wrote late in the block: a culprit's prefill
        blocked = row["gap_held_ms"]
    parts: dict[str, float | None] = {"read_lag_ms": blocked,
                                      "stall_ms": gap_ms - tokens * (row["baseline_ms"] or 0.0)}
    said = f"its {ms(gap_ms)} gap ({tokens} token{'s' if tokens != 1 else ''})"
    if blocked >= x:
        return Verdict("client_lag", f"loadgen's loop was blocked {ms(blocked)} of {said} (excess {ms(x)})",
                       parts=parts)
    if pressure and (row["gap_alone"] or cause == "unknown"):
        alone = "this stream's alone " if row["gap_alone"] else ""
        return Verdict("preemption", f"{said} was {alone}while the server's {pressure.removeprefix('its ')}",
                       parts=parts)
    if cause == "prefill":
        named = ", ".join(f"seq {s} ({p:,} tokens)" for s, p in zip(row["gap_culprits"] or [],
                                                                     row["gap_culprit_tokens"] or []))
        return Verdict("prefill", f"the prefill of {named} covered {said}", list(row["gap_culprits"] or []),
                       parts)
    if cause == "prefill_burst":
        return Verdict(cause, f"{said}: {row['gap_firsts']} other requests got their first token in it, a batch of "
                       "prefills none long enough to be a culprit alone", parts=parts)
    if cause == "unknown" and row["gap_alone"] is False:
        return Verdict("load", f"{said}: {row['gap_paused']} of the {row['gap_decoding']} other streams decoding "
                       "paused with it, a slow engine step for the batch, no long prefill, burst or preemption "
                       "in it", parts=parts)
    if cause == "unknown":
        return Verdict("unknown", f"{said} coincides with nothing loadgen sees{no_loop_note(row)}", parts=parts)
    return Verdict(cause, f"{said}: {CAUSES[cause]}", parts=parts)


def stall_sums(row: Row, end_ns: int | None = None) -> tuple[dict[str, float], list[int], int]:
    """The request's stalls (ending by ``end_ns``): excess per cause, the prefill culprits, how many."""
    sums: dict[str, float] = {}
    culprits: list[int] = []
    count = 0
    for s in row["stalls"] or []:
        if end_ns is not None and s["t_end_ns"] > end_ns:
            continue
        count += 1
        sums[s["cause"]] = sums.get(s["cause"], 0.0) + max(s["excess_ms"], 0.0)
        if s["cause"] == "prefill":
            culprits += [c for c in s["culprits"] if c not in culprits]
    return sums, culprits, count


def tpot(row: Row, value: float, limit: float) -> Verdict:
    """TPOT: its stalls' excess spread over its tokens ≥ half the excess → their largest cause; else every
    step slow (its median per-token ITL ≥ half its TPOT) → load; else unknown."""
    x, steps = value - limit, max((row["output_tokens"] or 2) - 1, 1)
    sums, culprits, count = stall_sums(row)
    total = sum(sums.values())
    parts: dict[str, float | None] = {"stall_ms": total, "send_lag_ms": row["send_lag_ms"]}
    if sums and total / steps >= HALF * x:
        cause = max(sums.items(), key=lambda kv: kv[1])[0]
        return Verdict(cause, f"its {count} stall{'s' if count != 1 else ''} added {ms(total)} ({total / steps:,.1f}"
                       f" ms a token; excess {x:,.1f} ms a token), most of it {cause}",
                       culprits if cause == "prefill" else [], parts)
    med = row["median_itl_ms"]
    if med is not None and med >= HALF * value:
        return Verdict("load", f"its median ITL {med:,.1f} ms is {med / value:.0%} of its {value:,.1f} ms TPOT: "
                       "every step slow, no single stall", parts=parts)
    return Verdict("unknown", f"TPOT {value:,.1f} ms over {limit:,.1f} ms: stalls {ms(total)}, median ITL "
                   f"{med if med is not None else float('nan'):,.1f} ms{no_loop_note(row)}", parts=parts)


def e2e(row: Row, value: float, limit: float, own: float, end: str, tokens: int) -> Verdict:
    """E2E (and the first answer token: ``end`` the time it is judged to, ``tokens`` decoded before it): its
    own prefill and decode at the run's usual pace over the limit → own_prompt; else the largest of client
    lag, network, the wait (preemption / queueing), the stalls' causes and load (decode time beyond its own
    and its stalls) if ≥ half the excess; else unknown."""
    x, base = value - limit, row["baseline_ms"] or 0.0
    own_total = own + max(tokens - 1, 0) * base
    send, read, net = row["send_lag_ms"] or 0.0, row[f"read_{end}_ms"], row["network_ms"]
    wait = (max(0.0, (row["ttft_service_ms"] or 0.0) - row["headers_late_ms"] - own - row["read_first_ms"])
            + (row.get("held_ms") or 0.0))  # with the send lag the in-flight cap held
    end_ns = row["t_done_ns"] if end == "done" else row["t_first_answer_ns"]
    sums, culprits, _ = stall_sums(row, end_ns)
    decode_ms = (end_ns - row["t_first_token_ns"]) / 1e6 if end_ns and row["t_first_token_ns"] else 0.0
    load = max(0.0, decode_ms - max(tokens - 1, 0) * base - sum(sums.values()))
    parts: dict[str, float | None] = {"send_lag_ms": send, "read_lag_ms": read, "network_ms": net, "wait_ms": wait,
                                      "own_ms": own_total, "stall_ms": sum(sums.values())}
    if own_total >= limit:
        return Verdict("own_prompt", f"its own prefill ({ms(own)}) and {tokens:,} tokens at the run's usual "
                       f"{base:,.1f} ms take ≈{ms(own_total)}, over the {ms(limit)} limit by themselves", parts=parts)
    sizes = {cause: excess for cause, excess in sums.items()}
    sizes["client_lag"] = max(send + read, sizes.get("client_lag", 0.0))
    sizes["network"] = net
    sizes[_wait_cause(row)] = sizes.get(_wait_cause(row), 0.0) + wait
    sizes["load"] = load
    words = {cause: f"its stalls of cause {cause} added {ms(v)}" for cause, v in sums.items()}
    if "prefill" in sums and culprits:
        words["prefill"] = f"prefill stalls (culprits seq {', '.join(map(str, culprits))}) added {ms(sums['prefill'])}"
    words.update({"client_lag": f"loadgen was {ms(sizes['client_lag'])} late (send lag and loop blocked)",
                  "network": f"the transport took {ms(net)}", _wait_cause(row): _wait_words(row, wait, own),
                  "load": f"its decode ran {ms(load)} beyond its tokens at the run's usual pace and its stalls"})
    what = f"{'E2E' if end == 'done' else 'first answer token'} {ms(value)} over {ms(limit)}"
    return _largest(sizes, words, x, parts, row, what, culprits)
