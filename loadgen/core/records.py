"""The raw records: one per request, one per content chunk. Columns = DESIGN §4 vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

ErrorKind = Literal["connect", "timeout_ttft", "timeout_idle", "timeout_request", "http_4xx", "http_429",
                    "http_5xx", "protocol", "cancelled"]


@dataclass(slots=True)
class RequestRecord:
    seq: int
    class_name: str
    warmup: bool
    t_intended_ns: int
    t_sent_ns: int
    t_first_token_ns: int | None
    t_last_token_ns: int | None
    t_done_ns: int
    prompt_tokens_asked: int
    prompt_tokens: int | None  # achieved: the server's usage, else the asked length (see prompt_tokens_source)
    prompt_tokens_source: str  # "server" | "asked"
    output_tokens_asked: int
    output_tokens: int
    output_tokens_source: str  # "server" (usage) | "local" (counted from the text)
    chunks: int
    request_id: str | None = None
    finish_reason: str | None = None
    http_status: int | None = None
    error_kind: str | None = None
    error_message: str | None = None
    reasoning: bool = False
    worker: int = 0
    conversation: int | None = None  # a multi-turn conversation's arrival index (None: a request on its own)
    turn: int | None = None  # its turn, from 0
    cached_tokens: int | None = None  # prompt tokens the server found in its prefix cache (usage), if it said
    # reasoning and tool calls (issue 38): TTFT (t_first_token_ns) is the first generated token of any kind
    t_first_answer_ns: int | None = None  # first chunk whose tokens are not all reasoning (answer or tool call)
    t_last_reasoning_ns: int | None = None  # last chunk with reasoning tokens (None: no reasoning)
    reasoning_tokens: int | None = None  # output tokens that were reasoning (usage details, else chunk counts)
    tool_tokens: int | None = None  # output tokens of tool-call names and arguments
    tool_calls: int | None = None  # tool calls in the answer
    # an agentic session's call (None: not a session call); copied from RequestMeta
    session: int | None = None  # the session's arrival index
    call: int | None = None  # its call index in the session
    agent: int | None = None  # 0 the main agent, k a sub-agent
    step: int | None = None  # the agent's step
    after_call: int | None = None  # the parent whose end released it (the last to end); None for roots
    t_ready_ns: int | None = None  # when its last parent ended (roots: the session's start)
    wait_ns: int | None = None  # tool wait / think time applied: t_intended_ns = t_ready_ns + wait_ns
    wait_kind: str | None = None  # "tool" | "think" | "none"
    # the transport (issue 39; None: not measured, or nothing came back)
    connect_ns: int | None = None  # opening the connection it went out on: TCP + proxy tunnel + TLS; 0: reused
    t_headers_ns: int | None = None  # the final response's status line and headers read (RFC 9112 §2.1, §6)
    # usage as a checked claim (issue 50; core/usage_claims.py): why a count the server claimed was not taken
    usage_rejected: str | None = None


@dataclass(slots=True)
class ChunkRecord:
    seq: int
    t_ns: int
    tokens: int
    reasoning: bool = False
    worker: int = 0


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of an answer (OpenAI chat ``tool_calls[i]``, Responses ``function_call``, Anthropic
    ``tool_use``): its id, the function's name and its arguments as streamed (JSON text, concatenated)."""
    id: str
    name: str
    arguments: str


REQUEST_COLUMNS = tuple(f.name for f in fields(RequestRecord))
CHUNK_COLUMNS = tuple(f.name for f in fields(ChunkRecord))
