"""A class's agentic sessions, reasoning knobs and tools (``workload.classes[].session``, ``.reasoning``,
``.tools``): pydantic models. A session is planned by plan/schedule.py (``Plan.session``) from this template
or from an agent trace (plan/agent_traces.py); its bodies are built by plan/session_bodies.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from loadgen.plan.lengths_spec import MAX_TOKENS, Distribution, Strict

MAX_STEPS = 200  # main-agent steps per user turn, user turns, sub-agent width and steps: each at most this


def _bounded(dist: Any, what: str, limit: int = MAX_STEPS) -> None:
    top = getattr(dist, "max", None) or getattr(dist, "value", None)
    if top is None or top > limit:
        raise ValueError(f"{what} needs a max (or a fixed value) of at most {limit}")


class SubAgents(Strict):
    """Fan-out and join: after a main-agent step, ``width`` sub-agents (each a fresh context of ``steps``
    calls) run in parallel; the main agent's next step waits for all of them and carries their answers."""

    probability: float = Field(ge=0, le=1, description="the chance that a main-agent step (not the last) spawns "
                               "sub-agents")
    width: Distribution = Field(description="sub-agents spawned together")
    steps: Distribution = Field(description="LLM calls of each sub-agent (tool waits between them)")

    @model_validator(mode="after")
    def _limits(self) -> "SubAgents":
        _bounded(self.width, "subagents.width")
        _bounded(self.steps, "subagents.steps")
        return self


class SessionTrace(Strict):
    """Sessions replayed from an agent trace file: arrival i takes the file's session i mod n (in file order
    when the class is the only one; ``sample: random``: one drawn by the seed); its calls keep their recorded
    graph, lengths, block reuse and waits. Sessions arrive by the load (rate_per_s or concurrency)."""

    path: Path = Field(description="the trace file (relative to the scenario file)")
    format: Literal["weka", "otel", "loadgen"] = Field(description="weka: WEKA agentic-coding traces (a JSON "
                                                       "object per session, or JSONL of them); otel: OpenTelemetry "
                                                       "GenAI spans (inference-perf's trace file, or OTLP JSON); "
                                                       "loadgen: our JSONL, one call a line (docs/agentic.md)")
    max_wait_s: float = Field(15.0, ge=0, le=3600, description="recorded tool waits and think times are capped "
                              "at this (as inference-perf's max_wait_ms)")
    sample: Literal["sequential", "random"] = Field("sequential", description="sequential: sessions in file "
                                                    "order, wrapping around; random: drawn by the seed")


class Session(Strict):
    """Each arrival of the class is an agent session: a graph of LLM calls with growing context, tool waits,
    sub-agents that fan out and join, and think time between user turns. The class's ``prompt_tokens`` is each
    step's new tokens (a tool result, a user message; the first call's, system prompt included, is
    ``first_prompt_tokens``), its ``output_tokens`` each answer. ``cache_bust`` tags each session."""

    steps: Distribution | None = Field(None, description="main-agent LLM calls per user turn (each but the last "
                                       "ends in a tool call)")
    turns: Distribution | None = Field(None, description="user turns per session (default 1); think_time_s "
                                       "between them")
    think_time_s: float = Field(0.0, ge=0, le=3600, description="seconds from a user turn's last answer to the "
                                "next user message")
    think_time_dist: Literal["fixed", "exponential"] = Field("fixed", description="exponential: think_time_s "
                                                            "is the mean")
    tool_wait_s: float = Field(0.0, ge=0, le=3600, description="seconds from a tool call's answer to the next "
                               "step (the tool running)")
    tool_wait_dist: Literal["fixed", "exponential"] = Field("fixed", description="exponential: tool_wait_s is "
                                                           "the mean")
    first_prompt_tokens: Distribution | None = Field(None, description="the task (the first call's message); "
                                                     "default: prompt_tokens like every step")
    subagents: SubAgents | None = Field(None, description="sub-agents that fan out after a step and join")
    cache_bust_calls: bool = Field(False, description="every call's own tag first: no prefix reuse at all, not "
                                   "even within a session (cache_bust alone: each session's tag)")
    trace: SessionTrace | None = Field(None, description="replay sessions from an agent trace instead of the "
                                       "template (steps, turns, subagents)")

    @model_validator(mode="after")
    def _source(self) -> "Session":
        if self.trace is not None and (self.steps or self.turns or self.subagents or self.first_prompt_tokens):
            raise ValueError("session.trace gives the sessions: drop steps, turns, subagents and "
                             "first_prompt_tokens")
        if self.trace is None and self.steps is None:
            raise ValueError("session needs steps (or a trace)")
        for dist, what in ((self.steps, "session.steps"), (self.turns, "session.turns")):
            if dist is not None:
                _bounded(dist, what)
        return self


class Reasoning(Strict):
    """Reasoning knobs in every request body of the class: chat ``reasoning_effort`` (and
    ``chat_template_kwargs.enable_thinking: false`` when disabled), Responses ``reasoning.effort``, Messages
    ``thinking.budget_tokens``. ``max_tokens`` becomes output_tokens + budget_tokens: output_tokens is the
    answer asked for, servers count reasoning inside max_tokens."""

    effort: Literal["minimal", "low", "medium", "high"] | None = Field(None, description="reasoning effort "
                                                                       "asked (none: the server's default)")
    budget_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description="most reasoning tokens (Anthropic "
                                      "needs at least 1024); added to max_tokens")
    enabled: bool = Field(True, description="false: ask the model not to think (enable_thinking false, "
                          "thinking disabled)")


class ToolFunction(Strict):
    """A function tool: its name, description and JSON Schema parameters (OpenAI's function definition)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="the function's name")
    description: str = Field("", description="what it does (sent to the model)")
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}},
                                       description="its JSON Schema")


class Tool(Strict):
    """A tool in OpenAI chat's shape; converted for Responses and Messages."""

    type: Literal["function"] = Field("function", description="function: the only kind sent")
    function: ToolFunction = Field(description="the function the model may call")


def check_class(cls: Any) -> None:
    """A class's session fields against its other fields (ValueError: one line)."""
    if cls.session is None:
        return
    if cls.conversation is not None:
        raise ValueError("session and conversation exclude each other")
    if cls.dataset is not None:
        raise ValueError("a session class takes synthetic prompts (or a trace), not a dataset")


def check_api(name: str, cls: Any, api: str) -> None:
    """A class's sessions, reasoning and tools against ``target.api`` (ValueError: one line)."""
    chat_like = api in ("chat", "responses", "messages")
    for field, what in (("session", "sessions"), ("tools", "tools"), ("reasoning", "reasoning knobs")):
        if getattr(cls, field) and not chat_like:
            raise ValueError(f"workload.classes[{name}]: {what} need target.api chat, responses or messages "
                             f"(not {api})")
    budget = cls.reasoning.budget_tokens if cls.reasoning is not None else None
    if api == "messages" and budget is not None and budget < 1024 and cls.reasoning.enabled:
        raise ValueError(f"workload.classes[{name}]: Anthropic thinking needs reasoning.budget_tokens >= 1024")
