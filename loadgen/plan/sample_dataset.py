"""The bundled sample dataset: ShareGPT-format conversations generated from a seed (nothing is downloaded), so
``scenarios/sharegpt.yaml`` runs anywhere. ``loadgen dataset sample`` writes it; the committed copy,
``scenarios/data/sharegpt_sample.json``, is checked against this generator by the tests.

Shape, modelled on public ShareGPT dumps: 1-6 user turns per conversation (mostly 1-2); a user message is
lognormal around 40 words, one in eight is a pasted document of several hundred; an answer is lognormal around
110 words. One in five conversations opens with a system prompt. The text is sentences of common English
words; its token counts, not its meaning, are what a load test needs.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from loadgen.plan.workload import WORDS

QUESTIONS = ("how", "why", "what", "when", "where", "which", "can", "could", "should", "would")
TURN_WEIGHTS = (40, 25, 15, 10, 6, 4)  # 1..6 user turns


def _sentence(rng: random.Random, words: int) -> str:
    body = " ".join(rng.choices(WORDS, k=max(1, words - 1)))
    return body[0].upper() + body[1:] + rng.choice((".", ".", ".", ",", "!"))


def _text(rng: random.Random, words: int, question: bool = False) -> str:
    out, left = [], max(3, words)
    while left > 0:
        n = min(left, rng.randint(6, 18))
        out.append(_sentence(rng, n))
        left -= n
    if question:
        out[-1] = f"{rng.choice(QUESTIONS).capitalize()} {out[-1][:-1].lower()}?"
    return " ".join(out)


def _words(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    return min(cap, max(3, round(median * math.exp(rng.gauss(0.0, sigma)))))


def conversation(rng: random.Random, index: int) -> dict[str, Any]:
    messages: list[dict[str, str]] = []
    if rng.random() < 0.2:
        messages.append({"from": "system", "value": _text(rng, _words(rng, 30, 0.4, 120))})
    for turn in range(rng.choices(range(1, 7), weights=TURN_WEIGHTS)[0]):
        document = turn == 0 and rng.random() < 0.125
        asked = _words(rng, 450, 0.5, 1500) if document else _words(rng, 40, 0.8, 400)
        messages.append({"from": "human", "value": _text(rng, asked, question=True)})
        messages.append({"from": "gpt", "value": _text(rng, _words(rng, 110, 0.7, 700))})
    return {"id": f"sample-{index:04d}", "conversations": messages}


def sample_dataset(conversations: int = 100, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(f"sharegpt-sample:{seed}")
    return [conversation(rng, i) for i in range(conversations)]


def sample_json(conversations: int = 100, seed: int = 0) -> str:
    return json.dumps(sample_dataset(conversations, seed), indent=1, ensure_ascii=False) + "\n"


def mooncake_sample(requests: int = 120, seed: int = 0, rate_per_s: float = 4.0) -> list[dict[str, Any]]:
    """A Mooncake-format trace (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids`` of 512-token
    blocks) with the sharing real traces show: five system prompts of 2-4 blocks that every session starts
    with, and sessions whose later requests extend their earlier ones' blocks (a conversation's history)."""
    rng = random.Random(f"mooncake-sample:{seed}")
    roots = [list(range(100 * r, 100 * r + rng.randint(2, 4))) for r in range(5)]
    sessions: list[list[int]] = []
    next_block, t_ms, out = 1000, 0.0, []
    for _ in range(requests):
        t_ms += rng.expovariate(rate_per_s) * 1000
        if not sessions or rng.random() < 0.4:
            sessions.append(list(rng.choice(roots)))
        blocks = sessions[rng.randrange(len(sessions))]
        blocks += list(range(next_block, next_block + rng.randint(1, 2)))
        next_block += 2
        length = len(blocks) * 512 - rng.randint(0, 511)
        out.append({"timestamp": round(t_ms), "input_length": length,
                    "output_length": _words(rng, 150, 0.5, 600), "hash_ids": list(blocks)})
    return out


def mooncake_jsonl(requests: int = 120, seed: int = 0) -> str:
    return "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in mooncake_sample(requests, seed))
