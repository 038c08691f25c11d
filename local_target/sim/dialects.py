"""Each engine's own token-count endpoints, as the simulator serves them under ``engine: ...``.

- vllm, sglang: ``POST /tokenize`` in vLLM's shape (``prompt`` or ``messages`` → ``count``, ``tokens``).
- llamacpp: ``POST /tokenize`` ``{"content", "add_special", "parse_special"}`` → ``{"tokens": [ids]}`` and
  ``POST /apply-template`` ``{"messages"}`` → ``{"prompt": rendered text}`` (llama-server's shapes).
- tgi: ``POST /tokenize`` ``{"inputs"}`` → ``[{"id", "text", "start", "stop"}]`` and ``POST /chat_tokenize`` (a
  chat request) → ``{"tokenize_response": [...], "templated_text"}`` (text-generation-inference's shapes).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from . import tokenizer
from .config import EngineConfig
from .openai_api import ApiError, tokenize_response

# a special marker and the newline after it are two tokens, as in ``tokenizer.chat_tokens``
_TEMPLATE = re.compile(r"(<\|\w+\|>)(\n)?|\w+|[^\w\s]")

Handler = Callable[[dict[str, Any], EngineConfig], Any]


def render_template(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """The chat prompt as text, with the same token count as ``tokenizer.chat_tokens``."""
    out = []
    for m in messages:
        out.append(f"<|{m.get('role', 'user')}|>\n{tokenizer.message_text(m)}<|end|>\n")  # tool calls too
    if add_generation_prompt:
        out.append("<|assistant|>\n")
    return "".join(out)


def template_tokens(text: str, parse_special: bool = True) -> list[str]:
    if not parse_special:
        return tokenizer.tokenize(text)
    out: list[str] = []
    for m in _TEMPLATE.finditer(text):
        out += [m.group(1), "\n"] if m.group(2) else [m.group(0)]
    return out


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    return messages


def _llamacpp_tokenize(body: dict[str, Any], cfg: EngineConfig) -> Any:
    content = body.get("content")
    if not isinstance(content, str):
        return {"tokens": []}  # llama-server answers an empty list when content is missing
    return {"tokens": tokenizer.token_ids(template_tokens(content, bool(body.get("parse_special", True))))}


def _llamacpp_apply_template(body: dict[str, Any], cfg: EngineConfig) -> Any:
    return {"prompt": render_template(_messages(body))}


def _simple_tokens(tokens: list[str]) -> list[dict[str, Any]]:
    return [{"id": i, "text": t, "start": 0, "stop": 0} for i, t in zip(tokenizer.token_ids(tokens), tokens)]


def _tgi_tokenize(body: dict[str, Any], cfg: EngineConfig) -> Any:
    if not isinstance(body.get("inputs"), str):
        raise ApiError(422, "inputs must be a string", param="inputs")
    return _simple_tokens(tokenizer.tokenize(body["inputs"]))


def _tgi_chat_tokenize(body: dict[str, Any], cfg: EngineConfig) -> Any:
    messages = _messages(body)
    return {"tokenize_response": _simple_tokens(tokenizer.chat_tokens(messages)),
            "templated_text": render_template(messages)}


ROUTES: dict[str, dict[str, Handler]] = {
    "vllm": {"/tokenize": tokenize_response},
    "sglang": {"/tokenize": tokenize_response},
    "llamacpp": {"/tokenize": _llamacpp_tokenize, "/apply-template": _llamacpp_apply_template},
    "tgi": {"/tokenize": _tgi_tokenize, "/chat_tokenize": _tgi_chat_tokenize},
}
