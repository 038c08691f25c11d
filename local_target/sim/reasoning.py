"""What a request asks of the model's reasoning and tools, and the phase plan drawn for it. Pure, no I/O.

A request's output is a sequence of phases, each token in exactly one:

- **reasoning**: ``R`` tokens first, when the request asks for reasoning (chat ``reasoning_effort`` or
  ``chat_template_kwargs.enable_thinking``; Responses ``reasoning.effort``; Anthropic ``thinking: {type:
  enabled, budget_tokens}``) or the config sets ``reasoning.default_effort``. ``R`` is drawn per request from a
  seeded lognormal around the effort's median (``reasoning.median_tokens``), capped by ``budget_tokens`` and by
  ``max_tokens - 1``: ``max_tokens`` counts reasoning and answer together, as vLLM and OpenAI count it.
- then either the **answer** (text), or a **tool call** when the request gives ``tools`` (``tool_choice``
  ``required`` or a named function: always; ``auto``: with ``tool_call_probability``; ``none``: never): the
  function's name (its tokens, sent whole in one delta once complete, as vLLM's tool parsers do), then its
  arguments, a JSON object of exactly ``N`` simulator tokens (``{"key":" w w"}``; at least ``MIN_ARGS_TOKENS``),
  ``N`` drawn from a lognormal (``tool_call_median_tokens``, ``tool_call_sigma``). A tool call ends the answer
  (finish reason ``tool_calls``), even under ``ignore_eos``.

Every token's text is exactly one token under the simulator's tokenizer rule, so re-tokenizing what was
streamed (and what a client sends back) gives the counts in the trace.
"""

from __future__ import annotations

import math
import random
import re
import zlib
from dataclasses import dataclass
from typing import Any, Literal

from .config import EngineConfig
from .tokenizer import output_token, tokenize

Effort = Literal["minimal", "low", "medium", "high"]
EFFORTS: tuple[str, ...] = ("minimal", "low", "medium", "high")
Phase = Literal["reasoning", "answer", "name", "args"]
MIN_ARGS_TOKENS = 8  # {"key":""}: the smallest object with one member
REASONING_WORDS = ("let", "me", "think", "about", "what", "is", "asked", "first", "then", "check", "each",
                   "step", "so", "the", "result", "follows")
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_KEY = re.compile(r"^\w{1,40}$")


class AskError(ValueError):
    """A request field the simulator cannot honour (answered 400 naming ``param``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tool:
    name: str
    key: str  # the argument object's one member (the schema's first property, else "input")


@dataclass(frozen=True)
class Asks:
    """What one request asks: an effort (None: no reasoning unless the config's default), an explicit off, a
    thinking budget, and the tools with the tool choice."""

    effort: str | None = None
    off: bool = False
    on: bool = False  # reasoning asked without an effort: the config's default effort, else medium
    budget_tokens: int | None = None
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"  # auto | required | none
    forced: str | None = None  # the function a tool_choice names

    def resolved_effort(self, default: str | None) -> str | None:
        if self.off:
            return None
        return self.effort or default or ("medium" if self.on else None)


NO_ASKS = Asks()


@dataclass(frozen=True)
class ToolPlan:
    name: str
    key: str
    call_id: str
    name_tokens: int
    args_tokens: int

    @property
    def tokens(self) -> int:
        return self.name_tokens + self.args_tokens

    def arguments(self) -> str:
        return "".join(args_token(i, self.args_tokens, self.key) for i in range(self.args_tokens))


@dataclass(frozen=True)
class PhasePlan:
    """``reasoning_tokens`` R first (indexes ``0..R-1``), then the tool call's tokens, or the answer."""

    reasoning_tokens: int = 0
    tool: ToolPlan | None = None
    effort: str | None = None  # None: the request reasons not at all (no reasoning fields in its usage)

    @property
    def active(self) -> bool:
        return self.effort is not None or self.tool is not None

    def phase(self, index: int) -> Phase:
        if index < self.reasoning_tokens:
            return "reasoning"
        if self.tool is None:
            return "answer"
        return "name" if index - self.reasoning_tokens < self.tool.name_tokens else "args"

    def token_text(self, index: int) -> str:
        """The text of generated token ``index`` (one simulator token)."""
        phase, at = self.phase(index), index - self.reasoning_tokens
        if phase == "reasoning":
            return " " + REASONING_WORDS[index % len(REASONING_WORDS)]
        if phase == "answer":
            return output_token(at)
        assert self.tool is not None
        if phase == "name":
            return tokenize(self.tool.name)[at]
        return args_token(at - self.tool.name_tokens, self.tool.args_tokens, self.tool.key)

    def generated_tokens(self, count: int) -> list[str]:
        """The token strings of the first ``count`` generated tokens, as a tokenizer reads them back."""
        return [self.token_text(i).strip() for i in range(count)]

    def texts(self, generated: int) -> tuple[str, str, str]:
        """(reasoning, answer, tool arguments) text of an output ``generated`` tokens long."""
        parts: dict[str, list[str]] = {"reasoning": [], "answer": [], "name": [], "args": []}
        for i in range(generated):
            parts[self.phase(i)].append(self.token_text(i))
        return "".join(parts["reasoning"]), "".join(parts["answer"]), "".join(parts["args"])

    def counts(self, generated: int) -> dict[str, Any]:
        """Ground truth of an output ``generated`` tokens long: per phase, and the first answer-phase index."""
        reasoning = min(generated, self.reasoning_tokens)
        tool = min(generated - reasoning, self.tool.tokens) if self.tool else 0
        return {"reasoning_tokens": reasoning, "answer_tokens": generated - reasoning, "tool_tokens": tool,
                "tool_calls": 1 if self.tool and tool == self.tool.tokens else 0,
                "first_answer_index": self.reasoning_tokens if generated > self.reasoning_tokens else None}


def args_token(i: int, n: int, key: str) -> str:
    """Token ``i`` of a JSON object ``{"key":" w w …"}`` that is exactly ``n`` tokens (``n >= 8``)."""
    head = ("{", '"', key, '"', ":", '"')
    if i < len(head):
        return head[i]
    if i >= n - 2:
        return '"' if i == n - 2 else "}"
    return output_token(i - len(head))


def draw_lognormal(rng: random.Random, median: float, sigma: float) -> int:
    if median <= 0:
        return 0
    return max(0, round(median * math.exp(sigma * rng.gauss(0.0, 1.0))))


def draw_plan(asks: Asks, rng: random.Random, cfg: EngineConfig, max_tokens: int, request_id: str) -> PhasePlan:
    """The request's phases. Draws nothing when nothing is asked (so every run that asks for neither reasoning
    nor tools stays as it was)."""
    effort = asks.resolved_effort(cfg.reasoning.default_effort)
    reasoning = 0
    if effort is not None:
        median = getattr(cfg.reasoning.median_tokens, effort)
        reasoning = draw_lognormal(rng, median, cfg.reasoning.sigma)
        if asks.budget_tokens is not None:
            reasoning = min(reasoning, asks.budget_tokens)
        reasoning = min(reasoning, max_tokens - 1)
    tool = _draw_tool(asks, rng, cfg, max_tokens - reasoning, request_id)
    return PhasePlan(reasoning, tool, effort)


def _draw_tool(asks: Asks, rng: random.Random, cfg: EngineConfig, room: int, request_id: str) -> ToolPlan | None:
    if not asks.tools or asks.tool_choice == "none":
        return None
    if asks.tool_choice == "auto" and not (rng.random() < cfg.tool_call_probability):
        return None
    tool = next((t for t in asks.tools if t.name == asks.forced), asks.tools[0])
    name_tokens = len(tokenize(tool.name))
    args = max(MIN_ARGS_TOKENS, draw_lognormal(rng, cfg.tool_call_median_tokens, cfg.tool_call_sigma))
    args = min(args, room - name_tokens)
    if args < MIN_ARGS_TOKENS:  # no room left for a whole call: the model answers in text
        return None
    call_id = f"call_{zlib.crc32(request_id.encode()):08x}"
    return ToolPlan(tool.name, tool.key, call_id, name_tokens, args)


# ---- what each API's request asks ------------------------------------------------------------------------
def _effort(value: Any, param: str) -> tuple[str | None, bool]:
    """(effort, off) of an effort field; ``none`` (OpenAI's newest value) switches reasoning off."""
    if value is None:
        return None, False
    if value == "none":
        return None, True
    if value not in EFFORTS:
        raise AskError(param, f"{param} must be one of none, {', '.join(EFFORTS)}")
    return str(value), False


def _tool(spec: Any, i: int, style: str) -> Tool:
    fn = spec.get("function") if style == "chat" and isinstance(spec, dict) else spec
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not _NAME.match(fn["name"]):
        raise AskError(f"tools[{i}]", f"tools[{i}]: a function with a name ([A-Za-z0-9_.-], at most 64)")
    schema = fn.get("input_schema" if style == "messages" else "parameters") or {}
    props = list((schema.get("properties") or {}) if isinstance(schema, dict) else {})
    key = props[0] if props and isinstance(props[0], str) and _KEY.match(props[0]) else "input"
    return Tool(fn["name"], key)


def _tools(body: dict[str, Any], style: str) -> tuple[Tool, ...]:
    given = body.get("tools")
    if given is None:
        return ()
    if not isinstance(given, list):
        raise AskError("tools", "tools must be a list")
    return tuple(_tool(t, i, style) for i, t in enumerate(given))


def _choice(value: Any, style: str) -> tuple[str, str | None]:
    """(auto | required | none, the named function) of a ``tool_choice``."""
    if value is None:
        return "auto", None
    if style == "messages":
        kind = value.get("type") if isinstance(value, dict) else None
        mapped = {"auto": "auto", "any": "required", "tool": "required", "none": "none"}.get(str(kind))
        if mapped is None:
            raise AskError("tool_choice", "tool_choice.type must be auto, any, tool or none")
        return mapped, value.get("name")
    if value in ("auto", "required", "none"):
        return str(value), None
    if isinstance(value, dict) and value.get("type") == "function":
        fn = value.get("function") if style == "chat" else value
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return "required", fn["name"]
    raise AskError("tool_choice", "tool_choice must be auto, required, none or a named function")


def chat_asks(body: dict[str, Any]) -> Asks:
    effort, off = _effort(body.get("reasoning_effort"), "reasoning_effort")
    kwargs = body.get("chat_template_kwargs")
    thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    choice, forced = _choice(body.get("tool_choice"), "chat")
    return Asks(effort, off or thinking is False, thinking is True, None, _tools(body, "chat"), choice, forced)


def responses_asks(body: dict[str, Any]) -> Asks:
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise AskError("reasoning", "reasoning must be an object ({effort})")
    effort, off = _effort((reasoning or {}).get("effort"), "reasoning.effort")
    choice, forced = _choice(body.get("tool_choice"), "responses")
    return Asks(effort, off, reasoning is not None, None, _tools(body, "responses"), choice, forced)


def messages_asks(body: dict[str, Any]) -> Asks:
    thinking = body.get("thinking")
    on, off, budget = False, False, None
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise AskError("thinking.budget_tokens", "thinking.budget_tokens: a positive integer")
        on = True
    elif isinstance(thinking, dict) and thinking.get("type") == "disabled":
        off = True
    elif thinking is not None:
        raise AskError("thinking", "thinking must be {type: enabled, budget_tokens} or {type: disabled}")
    choice, forced = _choice(body.get("tool_choice"), "messages")
    return Asks(None, off, on, budget, _tools(body, "messages"), choice, forced)

