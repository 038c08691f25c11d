"""Automatic prefix caching, as vLLM's ``KVCacheManager`` does it: KV blocks of ``block_size_tokens`` tokens are
named by a chained hash of their tokens and every block before them, so a block is reused only when the whole
prefix up to it matches.

- A request's *prompt* is cut into full blocks when it arrives (``block_hashes``). At admission the scheduler
  looks up the longest run of leading blocks already cached; those tokens are not prefilled again (at least one
  token always is: the step that computes it emits the first token), which shortens the prefill and so TTFT.
- Blocks enter the cache when they are computed: the prompt's full blocks when its prefill completes, and the
  prompt's plus the generated tokens' full blocks when the request finishes, so a conversation's next turn (its
  history: earlier prompts and the answers received) hits everything up to the last full block.
- Eviction is least-recently-used over at most ``kv_cache_tokens // block_size_tokens`` blocks. Simplification:
  cached blocks do not share KV with running requests (a hit still takes KV room for the request, like a copy),
  so the cache never changes when the scheduler preempts.

The generated tokens' strings are the tokenizer's ``output_token(i)`` without its leading space, which is what
tokenizing the answer's text (the next turn's history) gives, so the hashes agree. A request that reasoned or
called a tool inserts what it really generated (``PhasePlan.generated_tokens``): reasoning, then the answer or
the tool call's name and arguments. A client resends the answer and the tool call (the tokenizer counts an
assistant message's ``tool_calls`` as exactly those tokens) but drops the reasoning, as chat templates do, so
the next call's hit runs through a tool call that followed no reasoning, and stops at the last full block
before the reasoning otherwise — as on a real server, whose cached blocks hold the reasoning.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

from .tokenizer import output_token

if TYPE_CHECKING:
    from .reasoning import PhasePlan


def block_hashes(tokens: Sequence[str], block_size: int, parent: int = 0, start: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` (``start``: the first block's index; ``parent``: the hash
    of the block before it)."""
    out: list[int] = []
    for i in range(start * block_size, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[i:i + block_size])))
        out.append(parent)
    return out


def generated_tokens(count: int, plan: "PhasePlan | None" = None) -> list[str]:
    if plan is not None:
        return plan.generated_tokens(count)
    return [output_token(i).strip() for i in range(count)]


class PrefixCache:
    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        self.block_size = block_size
        self.capacity_blocks = max(1, capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries_tokens = 0  # vLLM's prefix_cache_queries: prompt tokens looked up
        self.hits_tokens = 0  # ... and found

    def __len__(self) -> int:
        return len(self._blocks)

    def match_tokens(self, hashes: Sequence[int]) -> int:
        """Tokens of the longest cached run of leading blocks (no side effects)."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n * self.block_size

    def use(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Admission: the cached prompt tokens (at most ``prompt_tokens - 1``), counted and marked recent."""
        hit = min(self.match_tokens(hashes), prompt_tokens - 1)
        hit -= hit % self.block_size
        for h in hashes[:hit // self.block_size]:
            self._blocks.move_to_end(h)
        self.queries_tokens += prompt_tokens
        self.hits_tokens += hit
        return hit

    def insert(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
