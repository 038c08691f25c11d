""""Did you mean …?" for a scenario field that does not exist: the fields the scenario's models accept at that
place (walked from ``Scenario``'s annotations), the closest by spelling (difflib), a field the name begins
(``duration`` → ``duration_s``), or a small map of other tools' words (``input_len`` → ``prompt_tokens``)."""

from __future__ import annotations

import difflib
import typing
from typing import Any, Sequence

from pydantic import BaseModel

# other tools' words (vllm bench, GuideLLM, Locust) for the scenario's fields
SYNONYMS = {"rate": "rate_per_s", "qps": "rate_per_s", "request_rate": "rate_per_s", "duration": "duration_s",
            "input_len": "prompt_tokens", "input_tokens": "prompt_tokens", "output_len": "output_tokens",
            "max_tokens": "output_tokens", "concurrency_limit": "max_in_flight", "users": "concurrency",
            "timeout": "request_timeout_s", "warmup": "warmup_s", "url": "base_url"}


def _models_in(annotation: Any) -> set[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, unions, lists, dicts, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {annotation}
    found: set[type[BaseModel]] = set()
    for arg in typing.get_args(annotation):
        found |= _models_in(arg)
    return found


def _names(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}


def fields_at(root: type[BaseModel], loc: Sequence[str | int]) -> set[str]:
    """The field names accepted at ``loc`` (a mapping's path: list indices and union tags are passed over)."""
    models = {root}
    for part in loc:
        inner: set[type[BaseModel]] = set()
        for model in models:
            field = model.model_fields.get(str(part))
            if field is None:
                field = next((f for f in model.model_fields.values() if f.alias == part), None)
            if field is not None:
                inner |= _models_in(field.annotation)
        if inner:
            models = inner  # else an index or a union's tag: the same models
    return {name for model in models for name in _names(model)}


def suggest(root: type[BaseModel], loc: Sequence[str | int], name: str) -> str | None:
    """The field meant by ``name`` at ``loc``, or None."""
    fields = fields_at(root, loc)
    word = name.strip().lower().replace("-", "_")
    if word in fields and word != name:
        return word
    if SYNONYMS.get(word) in fields:
        return SYNONYMS[word]
    starts = sorted(f for f in fields if f.startswith(word + "_"))
    if len(starts) == 1:
        return starts[0]
    close = difflib.get_close_matches(word, sorted(fields), n=1, cutoff=0.6)
    return close[0] if close else None


__all__ = ["SYNONYMS", "fields_at", "suggest"]
