"""Request bodies of a session's calls: a neutral transcript (OpenAI chat messages, ``tool_calls`` and
``role: tool`` included) → the body of ``target.api`` (chat, Responses, Anthropic Messages), with the class's
reasoning knobs and tools (``add_knobs``, which plain requests get too). Pure.

Tool results travel as each API defines them: chat ``role: tool`` messages with ``tool_call_id`` (OpenAI Chat
Completions); Responses ``function_call`` + ``function_call_output`` items (OpenAI Responses API); Messages
``tool_use`` blocks answered by ``tool_result`` blocks in the next user message (Anthropic Messages API). A
context call that answered in text instead of a tool call gets its result as a user message (counted by the
analysis as a missing tool call). Reasoning is never carried to the next call (clients drop it). Knobs: chat
``reasoning_effort`` (OpenAI; vLLM gpt-oss) and ``chat_template_kwargs.enable_thinking: false`` (Qwen3 on
vLLM/SGLang); Responses ``reasoning.effort``; Messages ``thinking: {type: enabled, budget_tokens}`` (Anthropic
extended thinking, which allows only ``tool_choice: auto`` — so no forced tool there). ``max_tokens`` is the
answer asked for plus ``budget_tokens``: servers count reasoning inside it. Known limit: Anthropic asks that an
assistant turn's thinking blocks come back with its ``tool_use`` blocks when thinking is on; loadgen drops
reasoning from transcripts (as chat clients do), so such a call is refused by Anthropic's own API (the simulator
and OpenAI-compatible servers accept it).
"""

from __future__ import annotations

import json
import random
from typing import Any, Protocol, Sequence

from loadgen.plan.scenario import RequestClass, Scenario
from loadgen.plan.schedule import PlannedRequest

Message = dict[str, Any]  # OpenAI chat shape: role, content, tool_calls, tool_call_id
Transcript = list[Message]  # a call's messages and the answer it received (system prompt excluded)
NO_OUTPUT = "(no output)"  # a tool call's result when the plan has no text for it


class PromptText(Protocol):  # plan/workload.py's Prompt (not imported: workload builds its bodies here)
    @property
    def system(self) -> str | None: ...

    @property
    def user(self) -> str: ...


class ToolCallLike(Protocol):  # core/records.py ToolCall
    @property
    def id(self) -> str: ...


class CallResultLike(Protocol):  # drivers/sessions.py CallResult: a joined parent's answer
    @property
    def agent(self) -> int: ...

    @property
    def answer(self) -> str: ...


def new_messages(req: PlannedRequest, prompt: PromptText, parent_tool_calls: Sequence[ToolCallLike],
                 joined_calls: Sequence[CallResultLike]) -> list[Message]:
    """The messages call ``req`` adds to its context's transcript: one ``role: tool`` result per tool call its
    context made (the first carries the planned text, ``prompt.user``; at a join, the sub-agents' answers come
    first, one per tool call, any left over in the last); without tool calls a user message with the same text."""
    results = [f"sub-agent {j.agent}: {j.answer}" for j in joined_calls] + [prompt.user]
    if not parent_tool_calls:
        return [{"role": "user", "content": "\n\n".join(results)}]
    n = len(parent_tool_calls)
    texts = results[:n - 1] + ["\n\n".join(results[n - 1:])] if len(results) >= n else \
        results + [NO_OUTPUT] * (n - len(results))
    return [{"role": "tool", "tool_call_id": t.id, "content": text} for t, text in zip(parent_tool_calls, texts)]


def session_tag(seed: int, cls: RequestClass, req: PlannedRequest) -> str | None:
    """A session call's cache-busting tag (it opens the system prompt): the session's own with ``cache_bust``
    (its calls still share their prefix, sessions do not), the call's own with ``session.cache_bust_calls``
    (nothing shared at all); None: no tag (or not a session call)."""
    if req.session is None or cls.session is None or not (cls.cache_bust or cls.session.cache_bust_calls):
        return None
    key = f"{req.session}:{req.call}" if cls.session.cache_bust_calls else str(req.session)
    return f"session {random.Random(f'session-tag:{seed}:{key}').getrandbits(40):010x}:"


def session_body(scenario: Scenario, model: str, cls: RequestClass, prompt: PromptText, transcript: Transcript,
                 new: list[Message], output_tokens: int, tool_turn: bool, continuous_usage: bool) -> dict[str, Any]:
    """The body of a session call: system prompt, ``transcript`` then ``new``, in ``target.api``'s shape."""
    api = scenario.target.api
    messages = transcript + new
    body: dict[str, Any] = {"model": model, "stream": True}
    if api == "chat":
        body.update(max_tokens=output_tokens, stream_options={"include_usage": True},
                    messages=([{"role": "system", "content": prompt.system}] if prompt.system else []) + messages)
        if continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
    elif api == "responses":
        body.update(input=responses_input(messages), max_output_tokens=output_tokens,
                    **({"instructions": prompt.system} if prompt.system else {}))
    elif api == "messages":
        body.update(messages=anthropic_messages(messages), max_tokens=output_tokens,
                    **({"system": prompt.system} if prompt.system else {}))
    else:
        raise ValueError(f"sessions need target.api chat, responses or messages (not {api})")
    if cls.ignore_eos and api != "messages":  # vLLM's extensions; Anthropic's API takes no unknown field
        body.update(ignore_eos=True, min_tokens=output_tokens)
    add_knobs(body, api, cls, output_tokens, tool_turn)
    body.update(scenario.target.extra_body)
    return body


def add_knobs(body: dict[str, Any], api: str, cls: RequestClass, output_tokens: int, tool_turn: bool) -> None:
    """The class's reasoning knobs and tools into ``body`` (nothing when it has neither)."""
    r, tools = cls.reasoning, [t.model_dump() for t in cls.tools or []]
    budget = r.budget_tokens if r is not None and r.enabled and r.budget_tokens else 0
    if r is not None:
        limit = {"chat": "max_tokens", "completions": "max_tokens", "responses": "max_output_tokens",
                 "messages": "max_tokens"}.get(api)
        if limit is not None and budget:
            body[limit] = output_tokens + budget
        if api == "chat" and r.enabled and r.effort:
            body["reasoning_effort"] = r.effort
        elif api == "chat" and not r.enabled:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        elif api == "responses" and r.enabled and r.effort:
            body["reasoning"] = {"effort": r.effort}
        elif api == "messages" and budget:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    if not tools:
        return
    if api == "responses":
        body["tools"] = [{"type": "function", "name": t["function"]["name"], "description":
                          t["function"]["description"], "parameters": t["function"]["parameters"]} for t in tools]
    elif api == "messages":
        body["tools"] = [{"name": t["function"]["name"], "description": t["function"]["description"],
                          "input_schema": t["function"]["parameters"]} for t in tools]
    else:
        body["tools"] = tools
    if tool_turn and api != "messages":
        body["tool_choice"] = "required"
    elif tool_turn and "thinking" not in body:  # extended thinking allows tool_choice auto only
        body["tool_choice"] = {"type": "any"}


def responses_input(messages: Transcript) -> list[dict[str, Any]]:
    """Chat messages as Responses input items: tool calls as ``function_call``, results as
    ``function_call_output``."""
    items: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
            continue
        if m.get("content"):
            items.append({"role": m["role"], "content": m["content"]})
        for t in m.get("tool_calls") or []:
            items.append({"type": "function_call", "call_id": t["id"], "name": t["function"]["name"],
                          "arguments": t["function"]["arguments"]})
    return items


def anthropic_messages(messages: Transcript) -> list[dict[str, Any]]:
    """Chat messages as Anthropic Messages: tool calls as ``tool_use`` blocks, results as ``tool_result`` blocks
    of a user message; consecutive messages of one role merged (the API wants them alternating)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = "user" if m["role"] == "tool" else m["role"]
        if m["role"] == "tool":
            blocks = [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}]
        else:
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            blocks += [{"type": "tool_use", "id": t["id"], "name": t["function"]["name"],
                        "input": _arguments(t["function"]["arguments"])} for t in m.get("tool_calls") or []]
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return [m if len(m["content"]) != 1 or m["content"][0]["type"] != "text" else
            {"role": m["role"], "content": m["content"][0]["text"]} for m in out]


def _arguments(text: str) -> Any:
    """A tool call's streamed arguments as Anthropic's ``input`` object (text that is not a JSON object: kept)."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}
