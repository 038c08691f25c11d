"""OpenTelemetry GenAI spans → sessions (one trace = one session), as inference-perf replays them
(kubernetes-sigs/inference-perf ``docs/otel_trace_replay.md``, ``otel_trace_to_replay_graph.py``), with the
attribute names of the OpenTelemetry GenAI semantic conventions (opentelemetry.io/docs/specs/semconv/gen-ai).

Read: inference-perf's trace file ``{"trace_id", "spans": [{span_id, name, start_time, end_time (ISO 8601),
attributes: {...}}]}`` (a file, a JSON list or JSONL of them), or an OTLP/JSON export ``{"resourceSpans":
[{"scopeSpans": [{"spans": [{traceId, spanId, startTimeUnixNano, endTimeUnixNano, attributes: [{key,
value}]}]}]}]}`` (each traceId a session). LLM calls are spans whose ``gen_ai.operation.name`` is ``chat`` or
``text_completion`` (or named ``chat …``); ``invoke_agent`` and ``execute_tool`` spans send nothing.

Dependencies (inference-perf's inference; ``parent_span_id`` is not used): a *causal* edge P → X when an
assistant message of X's ``gen_ai.input.messages`` holds P's output (P's causal ancestors are skipped), and a
*temporal* edge from the call that ended last before X started unless it is already an ancestor. The wait is
X's start less its latest parent's end (capped); it is a tool wait when an ``execute_tool`` span ran in it or
X is a sub-agent's first call, else think time. Lengths: ``gen_ai.usage.input_tokens``/``output_tokens``
(older ``prompt_tokens``/``completion_tokens`` accepted; else the text's characters / 4). Agents: by
``gen_ai.agent.name`` in order of appearance (the first is the main agent 0); the context of X is its causal
parent of the same agent (else its latest causal parent; else a temporal parent of the same agent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

from loadgen.plan import nesting
from loadgen.plan.scenario import ScenarioError
from loadgen.plan.sessions import SessionCall, SessionPlan, WaitKind

LLM_OPERATIONS = ("chat", "text_completion", "generate_content")


@dataclass
class _Span:
    span_id: str
    name: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any]
    parents: list[int] = field(default_factory=list)
    causal: list[int] = field(default_factory=list)


def read_otel(documents: Iterable[tuple[str, Any]], max_wait_s: float) -> list[SessionPlan]:
    sessions: list[SessionPlan] = []
    for where, doc in documents:
        for trace_id, spans in _traces(doc, where).items():
            sessions.append(_session(trace_id, spans, where, int(max_wait_s * 1e9)))
    return sessions


def _traces(doc: Any, where: str) -> dict[str, list[_Span]]:
    """The document's spans by trace id (inference-perf's file: one trace; OTLP JSON: any number)."""
    if isinstance(doc, dict) and isinstance(doc.get("spans"), list):
        tid = str(doc.get("session_id") or doc.get("trace_id") or where)
        return {tid: [_flat_span(s, f"{where}: spans[{k}]") for k, s in enumerate(doc["spans"])]}
    if isinstance(doc, dict) and isinstance(doc.get("resourceSpans"), list):
        out: dict[str, list[_Span]] = {}
        for rs in doc["resourceSpans"]:
            for ss in (rs or {}).get("scopeSpans") or []:
                for k, s in enumerate((ss or {}).get("spans") or []):
                    out.setdefault(str((s or {}).get("traceId", "")), []).append(_otlp_span(s, f"{where}: span {k}"))
        return out
    raise ScenarioError(f"{where}: an OpenTelemetry trace is an object with spans (inference-perf) or "
                        "resourceSpans (OTLP JSON)")


def _flat_span(s: Any, where: str) -> _Span:
    if not isinstance(s, dict) or not isinstance(s.get("attributes", {}), dict):
        raise ScenarioError(f"{where}: a span is an object with name, start_time, end_time and attributes")
    start, end = _iso_ns(s.get("start_time"), where), _iso_ns(s.get("end_time"), where)
    return _checked(_Span(str(s.get("span_id", "")), str(s.get("name", "")), start, end, s.get("attributes", {})),
                    where)


def _otlp_span(s: Any, where: str) -> _Span:
    if not isinstance(s, dict):
        raise ScenarioError(f"{where}: a span is an object")
    try:
        start, end = int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
    except (KeyError, TypeError, ValueError):
        raise ScenarioError(f"{where}: startTimeUnixNano and endTimeUnixNano must be whole nanoseconds") from None
    attrs = {str(a.get("key")): _otlp_value(a.get("value") or {}) for a in s.get("attributes") or []
             if isinstance(a, dict)}
    return _checked(_Span(str(s.get("spanId", "")), str(s.get("name", "")), start, end, attrs), where)


def _otlp_value(v: dict[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_otlp_value(x) for x in v["arrayValue"].get("values") or []]
    return None


def _checked(span: _Span, where: str) -> _Span:
    if span.end_ns < span.start_ns:
        raise ScenarioError(f"{where}: ends before it starts")
    return span


def _iso_ns(value: Any, where: str) -> int:
    try:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ScenarioError(f"{where}: start_time/end_time must be ISO 8601 times (got {value!r})") from None
    t = t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    return round(t.timestamp() * 1e6) * 1000


def _is_call(s: _Span) -> bool:
    op = s.attrs.get("gen_ai.operation.name")
    return op in LLM_OPERATIONS or (op is None and s.name.startswith("chat "))


def _session(trace_id: str, spans: list[_Span], where: str, max_wait_ns: int) -> SessionPlan:
    calls = sorted((s for s in spans if _is_call(s)), key=lambda s: s.start_ns)
    tools = [s for s in spans if s.attrs.get("gen_ai.operation.name") == "execute_tool"]
    if not calls:
        raise ScenarioError(f"{where}: trace {trace_id} has no chat spans")
    t0 = calls[0].start_ns
    outputs = [_output_text(s) for s in calls]
    agents: dict[str, int] = {}
    out: list[SessionCall] = []
    for k, x in enumerate(calls):
        said = _assistant_texts(x)
        causal = [p for p in range(k) if outputs[p] and calls[p].end_ns <= x.start_ns and
                  any(outputs[p] in t for t in said)]
        causal = [p for p in causal if not any(p in _ancestors(calls, q, True) for q in causal if q != p)]
        x.causal = causal
        ended = [p for p in range(k) if calls[p].end_ns <= x.start_ns]
        temporal = max(ended, key=lambda p: calls[p].end_ns, default=None)
        seen = set(causal).union(*(_ancestors(calls, q, False) for q in causal))
        x.parents = sorted(causal + ([temporal] if temporal is not None and temporal not in seen else []))
        agent = agents.setdefault(str(x.attrs.get("gen_ai.agent.name", "")), len(agents))
        context = _context(calls, x, causal, temporal)
        ready = max((calls[p].end_ns for p in x.parents), default=t0)
        wait = min(max(0, x.start_ns - ready), max_wait_ns)
        joins = len({str(calls[p].attrs.get("gen_ai.agent.name")) for p in x.parents}) > 1
        kind: WaitKind = "none" if wait == 0 else "tool" if context is None or joins or any(
            ready <= t.start_ns and t.end_ns <= x.start_ns for t in tools) else "think"
        before = 0 if context is None else _tokens(calls[context], "input") + _tokens(calls[context], "output")
        out.append(SessionCall(k, tuple(x.parents), context, wait, kind, agent,
                               sum(c.agent == agent for c in out), max(1, _tokens(x, "input") - before),
                               max(1, _tokens(x, "output")), False, x.start_ns - t0))
    tool_turns = {c.context for c in out if c.wait_kind == "tool"} | \
        {p for c in out if c.context is None for p in c.parents}  # a tool result follows, or sub-agents
    return SessionPlan(0, "", tuple(c if c.call not in tool_turns else _tool_turn(c) for c in out),
                       f"otel:{trace_id}")


def _tool_turn(c: SessionCall) -> SessionCall:
    return SessionCall(c.call, c.parents, c.context, c.wait_ns, c.wait_kind, c.agent, c.step, c.prompt_tokens,
                       c.output_tokens, True, c.t_offset_ns, c.blocks)


def _context(calls: list[_Span], x: _Span, causal: list[int], temporal: int | None) -> int | None:
    name = x.attrs.get("gen_ai.agent.name")
    same = [p for p in causal if calls[p].attrs.get("gen_ai.agent.name") == name]
    if same or causal:
        return max(same or causal, key=lambda p: calls[p].end_ns)
    if temporal is not None and name is not None and calls[temporal].attrs.get("gen_ai.agent.name") == name:
        return temporal
    return None


def _ancestors(calls: list[_Span], k: int, causal_only: bool) -> set[int]:
    seen: set[int] = set()
    todo = list(calls[k].causal if causal_only else calls[k].parents)
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += calls[p].causal if causal_only else calls[p].parents
    return seen


def _tokens(s: _Span, which: str) -> int:
    old = "prompt_tokens" if which == "input" else "completion_tokens"
    for key in (f"gen_ai.usage.{which}_tokens", f"gen_ai.usage.{old}"):
        value = s.attrs.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return int(value)
    text = _output_text(s) if which == "output" else " ".join(_message_texts(s, None))
    return max(1, len(text) // 4)


def _messages(value: Any) -> list[Any]:
    if isinstance(value, str):
        try:
            value = nesting.loads(value, "", 0)
        except ValueError:  # not JSON, or nested past MAX_NESTING: no messages (as any text that is not JSON)
            return []
    return value if isinstance(value, list) else [value] if isinstance(value, dict) else []


def _text(message: Any) -> str:
    if not isinstance(message, dict):
        return str(message or "")
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts = message.get("parts") if content is None else content
    return "".join(str(p.get("content") or p.get("text") or "") for p in parts or [] if isinstance(p, dict))


def _message_texts(s: _Span, role: str | None) -> list[str]:
    return [_text(m) for m in _messages(s.attrs.get("gen_ai.input.messages"))
            if role is None or (isinstance(m, dict) and m.get("role") == role)]


def _assistant_texts(s: _Span) -> list[str]:
    return [t for t in _message_texts(s, "assistant") if t]


def _output_text(s: _Span) -> str:
    for key in ("gen_ai.output.text", "gen_ai.completion", "gen_ai.output"):
        if isinstance(s.attrs.get(key), str):
            return str(s.attrs[key])
    return "".join(_text(m) for m in _messages(s.attrs.get("gen_ai.output.messages")))
