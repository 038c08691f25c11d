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


@dataclass(slots=True)
class ChunkRecord:
    seq: int
    t_ns: int
    tokens: int
    reasoning: bool = False
    worker: int = 0


REQUEST_COLUMNS = tuple(f.name for f in fields(RequestRecord))
CHUNK_COLUMNS = tuple(f.name for f in fields(ChunkRecord))
