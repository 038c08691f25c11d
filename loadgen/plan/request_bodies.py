"""A request's JSON body in ``target.api``'s shape, from its prompt (plan/workload.py's ``Prompt``; importable
from there too) and a conversation's history."""

from __future__ import annotations

from typing import Any

from loadgen.plan.scenario import RequestClass, Scenario
from loadgen.plan.session_bodies import PromptText, add_knobs
from loadgen.core.usage_claims import as_count

History = list[tuple[str, str]]  # a conversation's earlier turns: (the message sent, the answer received)


def request_body(scenario: Scenario, model: str, cls: RequestClass, prompt: PromptText, output_tokens: int,
                 continuous_usage: bool, history: History | None = None) -> dict[str, Any]:
    """The request's JSON body in ``target.api``'s shape (core/apis.py), streamed where the API streams."""
    api = scenario.target.api
    if api == "embeddings":
        text = f"{prompt.system}\n{prompt.user}" if prompt.system else prompt.user
        return {"model": model, "input": text, **scenario.target.extra_body}
    body: dict[str, Any] = {"model": model, "stream": True}
    if api in ("chat", "completions"):
        body.update(max_tokens=output_tokens, stream_options={"include_usage": True})
        if continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
    if cls.ignore_eos and api != "messages":  # vLLM's extensions; Anthropic's API takes no unknown field
        body.update(ignore_eos=True, min_tokens=output_tokens)
    turns: list[dict[str, str]] = []
    for sent, answer in history or []:
        turns += [{"role": "user", "content": sent}, {"role": "assistant", "content": answer}]
    turns.append({"role": "user", "content": prompt.user})
    system = [{"role": "system", "content": prompt.system}] if prompt.system else []
    if api == "chat":
        body["messages"] = system + turns
    elif api == "responses":
        body.update(input=turns, max_output_tokens=output_tokens, **({"instructions": prompt.system}
                                                                     if prompt.system else {}))
    elif api == "messages":
        body.update(messages=turns, max_tokens=output_tokens, **({"system": prompt.system} if prompt.system else {}))
    else:
        parts = [prompt.system] if prompt.system else []
        body["prompt"] = "\n".join(parts + [part for turn in history or [] for part in turn] + [prompt.user])
    add_knobs(body, api, cls, output_tokens, False)
    body.update(scenario.target.extra_body)
    return body


CAP_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def output_cap(scenario: Scenario, cls: RequestClass, output_tokens: int) -> int:
    """The most output tokens a request's body lets a server generate (a usage claim over it is impossible:
    core/usage_claims.py): the answer asked for plus the class's reasoning budget, or ``extra_body``'s own cap."""
    r = cls.reasoning
    budget = r.budget_tokens if r is not None and r.enabled and r.budget_tokens else 0
    caps = [scenario.target.extra_body.get(key) for key in CAP_KEYS]
    return max([output_tokens + budget] + [c for c in map(as_count, caps) if c is not None])
