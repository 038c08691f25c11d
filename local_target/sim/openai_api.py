"""OpenAI request validation and response/chunk formatting for the simulator. No I/O.

Chunks follow OpenAI's streaming format as vLLM emits it: for chat, a role-only first chunk
(``delta: {"role": "assistant", "content": ""}``) sent together with the first token, then one chunk per content
piece, ``finish_reason`` on the last content chunk, an optional usage-only chunk (``choices: []``) when
``stream_options.include_usage`` is set, and ``data: [DONE]``. ``continuous_usage_stats`` adds running usage to
every chunk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import tokenizer
from .config import EngineConfig
from .reasoning import NO_ASKS, AskError, Asks, PhasePlan, chat_asks


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @field_validator("messages")
    @classmethod
    def _roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, message in enumerate(messages):
            if message.get("role") not in ("system", "user", "assistant", "tool", "developer"):
                raise ValueError(f"messages[{i}].role must be system, user, assistant, tool or developer")
        return messages


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]


@dataclass
class Prepared:
    kind: Literal["chat", "completions", "responses", "messages", "embeddings"]
    model: str
    prompt_tokens: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    tokens: list[str]  # the rendered prompt's token strings (the prefix cache hashes them)
    asks: Asks = NO_ASKS  # what it asks of reasoning and tools (reasoning.py)


def _validation_error(exc: ValidationError) -> ApiError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"])
    return ApiError(400, f"{param}: {first['msg']}", param=param)


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def prompt_token_strs(req: ChatRequest | CompletionRequest) -> list[str]:
    """The prompt as the engine sees it: the chat template rendered, or the completion prompt (token ids as
    their decimal strings)."""
    if isinstance(req, ChatRequest):
        try:
            return tokenizer.chat_tokens(req.messages)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="messages") from None
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise ApiError(400, "the simulator takes one prompt per request", param="prompt")
        prompt = prompt[0]
    return [str(t) for t in prompt] if isinstance(prompt, list) else tokenizer.tokenize(prompt)


def prepare(kind: Literal["chat", "completions"], body: dict[str, Any], cfg: EngineConfig) -> Prepared:
    model_cls = ChatRequest if kind == "chat" else CompletionRequest
    try:
        req = model_cls.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    if req.model != cfg.model:
        raise ApiError(404, f"The model `{req.model}` does not exist.", "NotFoundError", "model", "model_not_found")
    tokens = prompt_token_strs(req)
    prompt_tokens = len(tokens)
    if prompt_tokens == 0:
        raise ApiError(400, "the prompt is empty", param="prompt")
    asked = getattr(req, "max_completion_tokens", None) or req.max_tokens
    max_tokens = asked or cfg.max_model_len - prompt_tokens
    if prompt_tokens + max_tokens > cfg.max_model_len or max_tokens < 1:
        raise ApiError(400, f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
                            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                            f"{max_tokens} in the completion).", param="max_tokens")
    if prompt_tokens + max_tokens > cfg.kv_cache_tokens:
        raise ApiError(400, f"prompt + max_tokens ({prompt_tokens + max_tokens}) exceeds the KV cache "
                            f"({cfg.kv_cache_tokens} tokens)", param="max_tokens")
    if req.min_tokens > max_tokens:
        raise ApiError(400, "min_tokens must not exceed max_tokens", param="min_tokens")
    opts = req.stream_options or StreamOptions()
    if req.stream_options is not None and not req.stream:
        raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")
    return Prepared(kind, req.model, prompt_tokens, max_tokens, req.min_tokens, req.ignore_eos, req.stream,
                    opts.include_usage, opts.continuous_usage_stats, tokens, asks_of(chat_asks, body, kind))


def asks_of(read: Callable[[dict[str, Any]], Asks], body: dict[str, Any], kind: str) -> Asks:
    """What ``body`` asks of reasoning and tools (chat only; completions ask nothing); a bad field is a 400."""
    if kind == "completions":
        return NO_ASKS
    try:
        return read(body)
    except AskError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
          reasoning_tokens: int | None = None, engine: str = "vllm") -> dict[str, Any]:
    """OpenAI's usage; with prefix caching on, ``prompt_tokens_details.cached_tokens`` as vLLM reports it; for a
    request that reasons, ``completion_tokens_details.reasoning_tokens`` (OpenAI, vLLM), or SGLang's top-level
    ``reasoning_tokens``."""
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if reasoning_tokens is not None and engine == "sglang":
        out["reasoning_tokens"] = reasoning_tokens
    elif reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


NO_PLAN = PhasePlan()


class ChunkFormatter:
    """Builds SSE events for one stream; the constant head of every chunk is serialized once.

    A request that reasons (``plan.effort``) streams its reasoning in ``field``: ``delta.reasoning_content``
    (SGLang, llama.cpp), ``delta.reasoning`` (vLLM >= 0.11.2), or ``think_tags`` (``<think>…</think>`` inline in
    ``content``, as TGI or a server without a reasoning parser); its usage adds the reasoning count. A tool call
    streams as vLLM's: ``delta.tool_calls[{id, type, index, function{name}}]``, then
    ``{index, function{arguments}}`` fragments."""

    def __init__(self, prep: Prepared, request_id: str, created: int, plan: PhasePlan = NO_PLAN,
                 field: str = "reasoning", engine: str = "vllm") -> None:
        self.prep, self.plan, self.field, self.engine = prep, plan, field, engine
        self.cached_tokens: int | None = None  # set at the first token when the prefix cache is on
        self._think = 0  # think_tags: 0 none sent, 1 <think> sent, 2 </think> sent
        obj = "chat.completion.chunk" if prep.kind == "chat" else "text_completion"
        self._head = (f'data: {{"id":{json.dumps(request_id)},"object":"{obj}","created":{created},'
                      f'"model":{json.dumps(prep.model)},"choices":[')

    def _usage(self, completion_tokens: int) -> dict[str, Any]:
        reasoning = None if self.plan.effort is None else min(completion_tokens, self.plan.reasoning_tokens)
        return usage(self.prep.prompt_tokens, completion_tokens, self.cached_tokens, reasoning, self.engine)

    def _event(self, choice: str, completion_tokens: int) -> bytes:
        tail = ""
        if self.prep.continuous_usage:
            tail = ',"usage":' + json.dumps(self._usage(completion_tokens))
        return f"{self._head}{choice}]{tail}}}\n\n".encode()

    def _delta(self, delta: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        reason = "null" if finish_reason is None else f'"{finish_reason}"'
        return self._event(f'{{"index":0,"delta":{{{delta}}},"logprobs":null,"finish_reason":{reason}}}',
                           completion_tokens)

    def start(self) -> bytes:
        """What goes out with the first token: chat's role-only chunk."""
        return self.role() if self.prep.kind == "chat" else b""

    def role(self) -> bytes:
        return self._event('{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
                           '"finish_reason":null}', 0)

    def _tagged(self, reasoning: str, text: str | None) -> str:
        """think_tags: the content that carries ``reasoning`` (then ``text``) inline, tags where they fall."""
        out = reasoning
        if reasoning and self._think == 0:
            out, self._think = "<think>" + out, 1
        if text is not None and self._think == 1:
            out, self._think = out + "</think>", 2
        return out + (text or "")

    def reasoning(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        if self.field == "think_tags":
            return self.content(text, finish_reason, completion_tokens, reasoning=True)
        return self._delta(f'"{self.field}":{json.dumps(text)}', finish_reason, completion_tokens)

    def mixed(self, reasoning: str, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        """One chunk that ends the reasoning and starts the answer (vLLM: ``{"content", "reasoning"}``)."""
        if self.field == "think_tags":
            return self.content(self._tagged(reasoning, text), finish_reason, completion_tokens, raw=True)
        return self._delta(f'"content":{json.dumps(text)},"{self.field}":{json.dumps(reasoning)}', finish_reason,
                           completion_tokens)

    def content(self, text: str, finish_reason: str | None, completion_tokens: int, reasoning: bool = False,
                raw: bool = False) -> bytes:
        if self.field == "think_tags" and not raw and (self._think or reasoning):
            text = self._tagged(text, None) if reasoning else self._tagged("", text)
        reason = "null" if finish_reason is None else f'"{finish_reason}"'
        if self.prep.kind == "chat":
            choice = f'{{"index":0,"delta":{{"content":{json.dumps(text)}}},"logprobs":null,"finish_reason":{reason}}}'
        else:
            choice = f'{{"index":0,"text":{json.dumps(text)},"logprobs":null,"finish_reason":{reason}}}'
        return self._event(choice, completion_tokens)

    def tool_start(self, call_id: str, name: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        call = {"id": call_id, "type": "function", "index": 0, "function": {"name": name}}
        return self._delta(f'"tool_calls":[{json.dumps(call, separators=(",", ":"))}]', finish_reason,
                           completion_tokens)

    def tool_args(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        return self._delta(f'"tool_calls":[{{"index":0,"function":{{"arguments":{json.dumps(text)}}}}}]',
                           finish_reason, completion_tokens)

    def final_usage(self, completion_tokens: int) -> bytes:
        body = json.dumps(self._usage(completion_tokens))
        return f'{self._head}],"usage":{body}}}\n\n'.encode()

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"


def full_response(prep: Prepared, request_id: str, created: int, plan: PhasePlan, generated: int,
                  finish_reason: str, cached_tokens: int | None = None, field: str = "reasoning",
                  engine: str = "vllm") -> dict[str, Any]:
    reasoning, text, arguments = plan.texts(generated)
    if prep.kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if plan.effort is not None and field == "think_tags":
            message["content"] = f"<think>{reasoning}</think>{text}" if reasoning else text
        elif plan.effort is not None:
            message[field] = reasoning
        if plan.tool is not None and plan.counts(generated)["tool_calls"]:
            message["content"] = None if field != "think_tags" or not reasoning else message["content"]
            message["tool_calls"] = [{"id": plan.tool.call_id, "type": "function",
                                      "function": {"name": plan.tool.name, "arguments": arguments}}]
            finish_reason = "tool_calls"
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    reasoning_tokens = plan.counts(generated)["reasoning_tokens"] if plan.effort is not None else None
    return {"id": request_id, "object": obj, "created": created, "model": prep.model, "choices": [choice],
            "usage": usage(prep.prompt_tokens, generated, cached_tokens, reasoning_tokens, engine)}


def tokenize_response(body: dict[str, Any], cfg: EngineConfig) -> dict[str, Any]:
    """vLLM's ``POST /tokenize``: ``{"prompt": ...}`` or ``{"messages": [...]}`` → count, tokens, max_model_len."""
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", param="messages")
        tokens = tokenizer.chat_tokens(messages, bool(body.get("add_generation_prompt", True)))
    elif isinstance(body.get("prompt"), str):
        tokens = tokenizer.tokenize(body["prompt"])
    else:
        raise ApiError(400, "give either prompt (a string) or messages", param="prompt")
    want_strs = bool(body.get("return_token_strs", False))
    return {"count": len(tokens), "max_model_len": cfg.max_model_len, "tokens": tokenizer.token_ids(tokens),
            "token_strs": tokens if want_strs else None}
