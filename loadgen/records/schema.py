"""The raw records as polars frames: the columns and types of ``requests.parquet`` and ``chunks.parquet``."""

from __future__ import annotations

import polars as pl

from loadgen.core.records import CHUNK_COLUMNS, REQUEST_COLUMNS, ChunkRecord, RequestRecord

REQUEST_SCHEMA = pl.Schema({
    "seq": pl.Int64, "class_name": pl.String, "warmup": pl.Boolean, "t_intended_ns": pl.Int64,
    "t_sent_ns": pl.Int64, "t_first_token_ns": pl.Int64, "t_last_token_ns": pl.Int64, "t_done_ns": pl.Int64,
    "prompt_tokens_asked": pl.Int64, "prompt_tokens": pl.Int64, "prompt_tokens_source": pl.String,
    "output_tokens_asked": pl.Int64, "output_tokens": pl.Int64, "output_tokens_source": pl.String,
    "chunks": pl.Int64, "request_id": pl.String, "finish_reason": pl.String, "http_status": pl.Int64,
    "error_kind": pl.String, "error_message": pl.String, "reasoning": pl.Boolean, "worker": pl.Int64,
    "conversation": pl.Int64, "turn": pl.Int64, "cached_tokens": pl.Int64,
    "t_first_answer_ns": pl.Int64, "t_last_reasoning_ns": pl.Int64, "reasoning_tokens": pl.Int64,
    "tool_tokens": pl.Int64, "tool_calls": pl.Int64, "session": pl.Int64, "call": pl.Int64, "agent": pl.Int64,
    "step": pl.Int64, "after_call": pl.Int64, "t_ready_ns": pl.Int64, "wait_ns": pl.Int64, "wait_kind": pl.String,
    "connect_ns": pl.Int64, "t_headers_ns": pl.Int64, "usage_rejected": pl.String,
})
LATER_COLUMNS = (  # added after the first release: null when absent
    "conversation", "turn", "cached_tokens",
    "t_first_answer_ns", "t_last_reasoning_ns", "reasoning_tokens", "tool_tokens", "tool_calls",  # issue 38
    "session", "call", "agent", "step", "after_call", "t_ready_ns", "wait_ns", "wait_kind",
    "connect_ns", "t_headers_ns",  # issue 39
    "usage_rejected",  # issue 50
)
CHUNK_SCHEMA = pl.Schema({"seq": pl.Int64, "t_ns": pl.Int64, "tokens": pl.Int64, "reasoning": pl.Boolean,
                          "worker": pl.Int64})
assert tuple(REQUEST_SCHEMA) == REQUEST_COLUMNS and tuple(CHUNK_SCHEMA) == CHUNK_COLUMNS


def requests_frame(records: list[RequestRecord]) -> pl.DataFrame:
    return pl.DataFrame({c: [getattr(r, c) for r in records] for c in REQUEST_COLUMNS}, schema=REQUEST_SCHEMA)


def chunks_frame(chunks: list[ChunkRecord]) -> pl.DataFrame:
    return pl.DataFrame({c: [getattr(r, c) for r in chunks] for c in CHUNK_COLUMNS}, schema=CHUNK_SCHEMA)
