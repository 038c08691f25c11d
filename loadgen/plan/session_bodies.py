"""Request bodies of a session's calls: a neutral transcript (OpenAI chat messages, ``tool_calls`` and
``role: tool`` included) → the body of ``target.api`` (chat, Responses, Anthropic Messages), with the class's
reasoning knobs and tools. Pure."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from loadgen.plan.scenario import RequestClass, Scenario
from loadgen.plan.schedule import PlannedRequest

Message = dict[str, Any]  # OpenAI chat shape: role, content, tool_calls, tool_call_id
Transcript = list[Message]  # a call's messages and the answer it received (system prompt excluded)


class PromptText(Protocol):  # plan/workload.py's Prompt (not imported: workload builds its bodies here)
    @property
    def system(self) -> str | None: ...

    @property
    def user(self) -> str: ...


def new_messages(req: PlannedRequest, prompt: PromptText, parent_tool_calls: Sequence[Any],
                 joined_calls: Sequence[Any]) -> list[Message]:
    """The messages call ``req`` adds to its context's transcript: its user message, or one tool result per
    tool call its context call made (``core.records.ToolCall``), plus the answers of the sub-agents it joins."""
    raise NotImplementedError("session bodies: being built (issue 38, P2)")


def session_body(scenario: Scenario, model: str, cls: RequestClass, prompt: PromptText, transcript: Transcript,
                 new: list[Message], output_tokens: int, tool_turn: bool, continuous_usage: bool) -> dict[str, Any]:
    """The body of a session call: system prompt, ``transcript`` then ``new``, in ``target.api``'s shape."""
    raise NotImplementedError("session bodies: being built (issue 38, P2)")
