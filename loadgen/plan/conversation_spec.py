"""A class's multi-turn conversations (``workload.classes[].conversation``); sent by drivers/conversations.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from loadgen.plan.lengths_spec import Distribution, Strict

MAX_TURNS = 1000


class Conversation(Strict):
    """A class whose every arrival is a conversation: ``turns`` requests one after another, each sent
    ``think_time_s`` after the previous answer ended, carrying the history (every earlier prompt and the answer
    actually received). The class's ``prompt_tokens`` is each turn's new message; its ``output_tokens`` each
    answer."""

    turns: Distribution | None = Field(None, description="turns per conversation (with a dataset: at most this "
                                       "many of each row's turns; default all of them)")
    first_prompt_tokens: Distribution | None = Field(None, description="the first turn's prompt (a document, "
                                                     "say); default: prompt_tokens like every turn")
    think_time_s: float = Field(0.0, ge=0, le=3600, description="seconds from an answer's end to the next turn")
    think_time_dist: Literal["fixed", "exponential"] = Field("fixed", description="exponential: think_time_s "
                                                            "is the mean")

    @field_validator("turns")
    @classmethod
    def _bounded(cls, turns: Any) -> Any:
        if turns is None:
            return turns
        top = getattr(turns, "max", None) or getattr(turns, "value", None)
        if top is None or top > MAX_TURNS:
            raise ValueError(f"turns needs a max (or a fixed value) of at most {MAX_TURNS}")
        return turns
