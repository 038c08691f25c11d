"""Agent traces → sessions (``SessionPlan``): WEKA agentic-coding traces, OpenTelemetry GenAI spans
(plan/otel_trace.py) and loadgen's own JSONL, each read strictly: a bad input is one line naming the file (and
line, for JSONL) and what is wrong (ScenarioError, exit 2).

* ``weka`` — the trace format of github.com/callanjfox/agentic-coding-analysis ``docs/TRACE_FORMAT.md`` (the
  WEKA Claude Code captures; SemiAnalysis ``cc-traces-weka-*``), replayed by AIPerf (``docs/tutorials/
  weka-trace.md``) and inference-perf (``docs/weka_trace_replay.md``). One JSON object per session (a file, a
  JSON list, a JSONL of them, or a directory of ``.json`` files): ``requests`` of ``{t, type: n|s, in, out,
  hash_ids, think_time, api_time, input_types, stop}`` and ``{type: subagent, agent_id, status, requests}``.
  Edges as AIPerf maps them: consecutive requests of a list chain (growing context); the last request before a
  sub-agent entry spawns it (a fresh context); the next request after it joins every sub-agent between the two
  (it waits for all of them, then its recorded delay); an ``async_launched`` sub-agent, or one with no later
  request, joins nothing (background). Sub-agent ``t`` is read from the session start (as AIPerf's fixtures).
  The delay is the recorded ``think_time`` (end-to-start), else ``t`` minus the latest parent's
  ``t + api_time``; ``hash_ids`` (ids local to the trace unless ``hash_id_scope: global``) give the text (a
  call extending its context: the ids past its context's). Every call streams (``type`` n or s alike); ``ttft``,
  ``api_time``, ``model`` and ``output_types`` are informative.
* ``loadgen`` — JSONL, one call a line: ``{"session", "call", "after": [...], "context", "wait_s",
  "wait_kind", "agent", "prompt_tokens", "output_tokens", "tool_turn"}`` (docs/agentic.md).

Every recorded wait is capped at ``max_wait_s``. A call's ``prompt_tokens`` is what it ADDS to its context's
transcript (a trace records whole prompts: ``in`` less the context call's ``in + out``, at least 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Literal

from loadgen.plan import nesting
from loadgen.plan.otel_trace import read_otel
from loadgen.plan.scenario import ScenarioError
from loadgen.plan.session_spec import SessionTrace
from loadgen.plan.sessions import SessionCall, SessionPlan, WaitKind, check_session

MAX_TRACE_BYTES = 512 * 1024 * 1024
TraceFormat = Literal["weka", "otel", "loadgen"]
LOCAL_SCOPE = 10**9  # a local hash id h of the trace's k-th session is (k + 1)·LOCAL_SCOPE + h


def read_agent_trace(spec: SessionTrace, base: Path | None = None) -> list[SessionPlan]:
    """Every session of the trace file ``spec.path`` (relative to ``base``), in file order."""
    path = spec.path if spec.path.is_absolute() or base is None else base / spec.path
    if spec.format == "otel":
        sessions = read_otel(_documents(path), spec.max_wait_s)
    elif spec.format == "weka":
        sessions = [_weka_session(doc, where, k, spec.max_wait_s) for k, (where, doc) in enumerate(_documents(path))]
    else:
        sessions = _loadgen_sessions(path, spec.max_wait_s)
    if not sessions:
        raise ScenarioError(f"{path}: no sessions in this {spec.format} trace")
    for s in sessions:
        check_session(s, f"{path}: session {s.source}")
    return sessions


def trace_format_of(path: Path) -> TraceFormat | None:
    """The agent trace format of ``path`` by its first document (``dataset inspect --format auto``): weka (an
    object with a ``requests`` list), otel (``spans`` or ``resourceSpans``), loadgen (a call: ``session`` and
    ``call``, our keys only); None for anything else (a dataset, a file that is not JSON)."""
    if not (path.is_dir() or path.suffix in (".json", ".jsonl")):
        return None
    try:
        if path.suffix == ".jsonl" and path.is_file():
            with path.open(encoding="utf-8") as f:  # the first line only: a trace may be large
                doc = nesting.loads(next((line for line in f if line.strip()), "null"), str(path), 1)
        else:
            doc = next(_documents(path))[1]
    except (OSError, UnicodeDecodeError, ValueError, ScenarioError, StopIteration):
        return None
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("requests"), list):
        return "weka"
    if isinstance(doc.get("spans"), list) or isinstance(doc.get("resourceSpans"), list):
        return "otel"
    return "loadgen" if {"session", "call"} <= set(doc) <= _KEYS else None


def _documents(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, JSON value) of every document: a directory's ``.json`` files, a JSONL's lines (``path:line``),
    or a JSON file's value (a list: each element)."""
    if path.is_dir():
        for child in sorted(path.glob("*.json")):
            yield from _documents(child)
        return
    text = _read(path)
    if path.suffix == ".jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                yield f"{path}:{n}", _parse(line, str(path), n)
        return
    value = _parse(text, str(path), None)
    for k, doc in enumerate(value if isinstance(value, list) else [value]):
        yield (f"{path}[{k}]" if isinstance(value, list) else str(path)), doc


def _read(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise ScenarioError(f"{path}: over {MAX_TRACE_BYTES >> 20} MiB; split the trace")
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the agent trace: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text") from None


def _parse(text: str, path: str, line: int | None) -> Any:
    """A document (a JSONL's line ``line``); nested past MAX_NESTING: ScenarioError naming its line."""
    where = path if line is None else f"{path}:{line}"
    try:
        return nesting.loads(text, path, line)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{where}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


# ---- WEKA ----------------------------------------------------------------------------------------------
class _Weka:
    """One WEKA session being flattened into calls (walk order is topological)."""

    def __init__(self, where: str, scope: int, max_wait_s: float, block: int) -> None:
        self.where, self.scope, self.max_wait_ns, self.block = where, scope, int(max_wait_s * 1e9), block
        self.calls: list[SessionCall] = []
        self.raw: list[dict[str, Any]] = []  # each call's request
        self.agents = 0

    def walk(self, requests: Any, at: str, agent: int, spawner: int | None) -> int | None:
        """Add a request list's calls (a sub-agent's: spawned by call ``spawner``); its last call."""
        if not isinstance(requests, list) or not requests:
            raise ScenarioError(f"{self.where}: {at} needs a non-empty list of requests")
        prev: int | None = None
        pending: list[int] = []  # last calls of sub-agents since ``prev``, which the next request joins
        step = 0
        for k, r in enumerate(requests):
            here = f"{at}[{k}]"
            if not isinstance(r, dict):
                raise ScenarioError(f"{self.where}: {here} is not an object")
            if r.get("type") == "subagent":
                self.agents += 1
                end = self.walk(r.get("requests"), f"{here}.requests", self.agents, prev)
                if end is not None and r.get("status") != "async_launched":
                    pending.append(end)
                continue
            if r.get("type") not in ("n", "s"):
                raise ScenarioError(f"{self.where}: {here}.type must be n, s or subagent (not {r.get('type')!r})")
            parents = ((prev,) if prev is not None else (spawner,) if spawner is not None else ()) + tuple(pending)
            self._add(r, here, parents, prev, agent, step)
            prev, pending, step = len(self.calls) - 1, [], step + 1
        return prev

    def _add(self, r: dict[str, Any], here: str, parents: tuple[int, ...], context: int | None, agent: int,
             step: int) -> None:
        size, out = _count(r, "in", self.where, here), max(1, _count(r, "out", self.where, here, 0))
        t = _seconds(r, "t", self.where, here)
        delay = _seconds(r, "think_time", self.where, here) if "think_time" in r else self._gap(t, parents)
        wait = min(int(delay * 1e9), self.max_wait_ns)
        kind: WaitKind = "none" if wait == 0 else "tool" if "tool_result" in (r.get("input_types") or []) or \
            context is None else "think"
        added = size if context is None else size - self.raw[context]["in"] - self.raw[context].get("out", 0)
        ids = r.get("hash_ids")
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(h, int) and h >= 0 for h in ids)):
            raise ScenarioError(f"{self.where}: {here}.hash_ids must be a list of whole numbers >= 0")
        if ids is not None and context is not None:
            ids = ids[len(self.raw[context].get("hash_ids") or []):]
        blocks = tuple(h + self.scope for h in ids) if ids else None
        self.calls.append(SessionCall(len(self.calls), parents, context, wait, kind, agent, step, max(1, added), out,
                                      r.get("stop") == "tool_use", int(t * 1e9), blocks))
        self.raw.append(r)

    def _gap(self, t: float, parents: tuple[int, ...]) -> float:
        ends = [_seconds(self.raw[p], "t", "", "") + float(self.raw[p].get("api_time") or 0) for p in parents]
        return max(0.0, t - max(ends, default=0.0))


def _weka_session(doc: Any, where: str, ordinal: int, max_wait_s: float) -> SessionPlan:
    if not isinstance(doc, dict) or "requests" not in doc:
        raise ScenarioError(f"{where}: a WEKA trace is an object with id and requests")
    block = doc.get("block_size", 64)
    if not isinstance(block, int) or block < 1:
        raise ScenarioError(f"{where}: block_size must be a whole number >= 1")
    scope = 0 if doc.get("hash_id_scope") == "global" else (ordinal + 1) * LOCAL_SCOPE
    weka = _Weka(where, scope, max_wait_s, block)
    weka.walk(doc["requests"], "requests", 0, None)
    return SessionPlan(0, "", tuple(weka.calls), f"weka:{doc.get('id', ordinal)}", block)


def _count(r: dict[str, Any], key: str, where: str, here: str, least: int = 1) -> int:
    value = r.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ScenarioError(f"{where}: {here}.{key} must be a whole number >= {least} (got {value!r})")
    return value


def _seconds(r: dict[str, Any], key: str, where: str, here: str) -> float:
    value = r.get(key, 0.0)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1e7:
        raise ScenarioError(f"{where}: {here}.{key} must be seconds >= 0 (got {value!r})")
    return float(value)


# ---- loadgen JSONL -------------------------------------------------------------------------------------
_KEYS = {"session", "call", "after", "context", "wait_s", "wait_kind", "agent", "step", "prompt_tokens",
         "output_tokens", "tool_turn"}


def _loadgen_sessions(path: Path, max_wait_s: float) -> list[SessionPlan]:
    """Our JSONL: one call a line, a session's calls in order (``after`` and ``context`` name earlier calls of
    the same session)."""
    sessions: dict[str, list[SessionCall]] = {}
    names: dict[str, dict[str, int]] = {}
    for where, doc in _documents(path):
        if not isinstance(doc, dict) or set(doc) - _KEYS or not {"session", "call"} <= set(doc):
            raise ScenarioError(f"{where}: a call is an object with session and call, and only the keys "
                                f"{', '.join(sorted(_KEYS))}")
        sid, cid = str(doc["session"]), str(doc["call"])
        calls, known = sessions.setdefault(sid, []), names.setdefault(sid, {})
        if cid in known:
            raise ScenarioError(f"{where}: session {sid} has call {cid} twice")
        after, context = doc.get("after", []), doc.get("context")
        if not isinstance(after, list) or any(str(a) not in known for a in after) or \
                (context is not None and str(context) not in known):
            raise ScenarioError(f"{where}: after and context must name earlier calls of session {sid}")
        agent = _count(doc, "agent", where, "", 0) if "agent" in doc else 0
        kind = doc.get("wait_kind", "tool" if doc.get("wait_s") else "none")
        if kind not in ("none", "tool", "think"):
            raise ScenarioError(f"{where}: wait_kind must be none, tool or think (got {kind!r})")
        step = _count(doc, "step", where, "", 0) if "step" in doc else sum(c.agent == agent for c in calls)
        known[cid] = len(calls)
        calls.append(SessionCall(
            len(calls), tuple(known[str(a)] for a in after), None if context is None else known[str(context)],
            min(int(_seconds(doc, "wait_s", where, "") * 1e9), int(max_wait_s * 1e9)), kind, agent, step,
            _count(doc, "prompt_tokens", where, ""), _count(doc, "output_tokens", where, ""),
            bool(doc.get("tool_turn", False))))
    return [SessionPlan(0, "", tuple(c), f"loadgen:{sid}") for sid, c in sessions.items()]


def describe(sessions: list[SessionPlan]) -> str:
    """What ``loadgen dataset inspect`` says of a trace: sessions, calls, agents, fan-out, joins, waits, lengths
    and how many blocks a session reuses (hash ids seen earlier in the same session)."""
    calls = [c for s in sessions for c in s.calls]
    sizes = [len(s.calls) for s in sessions]
    width = max((sum(1 for c in s.calls if c.parents == (p.call,) and c.agent != p.agent) for s in sessions
                 for p in s.calls), default=0)
    tool = sorted(c.wait_ns / 1e9 for c in calls if c.wait_kind == "tool")
    think = sorted(c.wait_ns / 1e9 for c in calls if c.wait_kind == "think")
    seen_blocks = reused = 0
    for s in sessions:
        seen: set[int] = set()
        for c in s.calls:
            reused += sum(1 for b in c.blocks or () if b in seen)
            seen_blocks += len(c.blocks or ())
            seen.update(c.blocks or ())
    return (f"{len(sessions)} sessions, {len(calls)} calls (per session: mean {len(calls) / len(sessions):.1f}, "
            f"max {max(sizes)}); agents per session: max {max(1 + max(c.agent for c in s.calls) for s in sessions)}"
            f"; widest fan-out {width}; joins {sum(len(c.parents) > 1 for c in calls)}; tool waits "
            f"{len(tool)} (median {_median(tool):.2f} s, max {max(tool, default=0):.2f} s); think times {len(think)} "
            f"(median {_median(think):.2f} s); new prompt tokens per call median "
            f"{_median(sorted(c.prompt_tokens for c in calls)):.0f}, output median "
            f"{_median(sorted(c.output_tokens for c in calls)):.0f}; repeated blocks within a session (beyond its carried context): "
            f"{reused / seen_blocks if seen_blocks else 0:.0%} of {seen_blocks}")


def _median(values: list[float] | list[int]) -> float:
    return float(values[len(values) // 2]) if values else 0.0
