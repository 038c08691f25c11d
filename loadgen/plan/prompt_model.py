"""Counting prompts without a ``/tokenize`` round trip each: a word model learned from the target's own counter,
and the sample of prompts still checked against it.

loadgen's synthetic prompts are a tag (``req <hex>:`` or ``session <hex>:``), then words of a fixed vocabulary
(``workload.WORDS``) and single-token padding words. Tokenizers that split on whitespace before merging (BPE and
SentencePiece models, the simulator's rule) count such a text as the sum of its words' tokens. ``WordModel``
learns each vocabulary word's cost once, before any load (two counts when every word is one token, else one per
word), and the count of each distinct (system prompt, tag) opening once, with every tag's hex replaced by one
fixed value. A prompt is then built against the model, locally.

Which prompts are still counted by the target (``sampled``): the first ``FIRST_VERIFIED`` of each class, then
those whose ``crc32("<seed>:<seq>")`` is a multiple of ``VERIFY_ONE_IN`` (about 1 in 32, the same requests on
every run of a scenario). A checked prompt whose count differs from the model's is nudged to the target's count
(it is exact), and from then on every prompt is checked (the model still gives the first guess): lengths stay
exact wherever the model ever missed. The model stands only where every tag counts alike (``TAG_PROBES`` other
tags counted once as it learns; a BPE tokenizer splits hex unevenly): elsewhere every prompt is counted.
``PromptStats`` says how many were built, checked and estimated, and the largest error found.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import asdict, dataclass
from typing import Any, Awaitable, Callable, Iterable

FIRST_VERIFIED = 16  # per class: the first prompts of each class are all checked
VERIFY_ONE_IN = 32  # then one request in this many, chosen by its seq
ALL_MATCHED = "the word model matched all"  # marks note()'s line when no estimate missed: routine, off the console
TAG_PROBES = 8  # other tags counted once: when any counts otherwise, every prompt is counted
_TAG = re.compile(r"(req|session) [0-9a-f]{10}:")

Count = Callable[[str | None, str], Awaitable[int]]


def sampled(seed: int, seq: int) -> bool:
    """Whether request ``seq`` is in the seeded 1-in-``VERIFY_ONE_IN`` sample (beyond each class's first)."""
    return zlib.crc32(f"{seed}:{seq}".encode()) % VERIFY_ONE_IN == 0


@dataclass
class PromptStats:
    """What the factory built: ``counted`` by the target's counter, ``estimated`` by the word model alone;
    ``checked`` of the counted had a model estimate to compare, ``missed`` of those differed, by at most
    ``max_error_tokens``. ``policy``: ``sampled`` (the model holds) or ``every prompt`` (no model, or it missed)."""

    built: int = 0
    counted: int = 0
    estimated: int = 0
    checked: int = 0
    missed: int = 0
    max_error_tokens: int = 0
    policy: str = "every prompt"

    def check(self, estimate: int | None, count: int) -> bool:
        """Record a counted prompt against the model's ``estimate``; True when they agree (or none to compare)."""
        if estimate is None:
            return True
        self.checked += 1
        error = abs(count - estimate)
        self.max_error_tokens = max(self.max_error_tokens, error)
        self.missed += error > 0
        if error:
            self.policy = "every prompt"  # the model missed: from now on every prompt is counted
        return error == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "first_verified_per_class": FIRST_VERIFIED, "verify_one_in": VERIFY_ONE_IN}

    def note(self) -> str | None:
        """One line for the run's notes (None when every prompt was counted by the target and the model, if
        any, never missed: each length is then the target's own count, nothing to say)."""
        if self.estimated == 0 and self.missed == 0:
            return None
        if self.missed == 0:
            return (f"prompt lengths: {self.counted:,} of {self.built:,} prompts counted by the target's tokenizer "
                    f"(each class's first {FIRST_VERIFIED}, then 1 in {VERIFY_ONE_IN}); {ALL_MATCHED} "
                    f"{self.checked:,} it was checked on, so the other {self.estimated:,} are its estimates")
        return (f"prompt lengths: the word model missed {self.missed:,} of the {self.checked:,} prompts checked "
                f"(by up to {self.max_error_tokens} tokens): every prompt from the first miss on was counted "
                f"by the target's tokenizer; {self.estimated:,} before it are estimates")


def normalized(text: str, tag: str) -> str:
    """``text`` with every request or session tag's hex replaced by ``tag``'s (one fixed value)."""
    hex_ = tag.split()[1]
    return _TAG.sub(lambda m: f"{m.group(1)} {hex_}", text)


class WordModel:
    """``count(system, user)`` = the target's count of (system, the user text's opening), measured once per
    distinct opening with tags normalized, + each later word's learned cost. None for a word it has no cost
    for (a dataset's text)."""

    def __init__(self, count: Count, costs: dict[str, int], tag: str, tags_alike: bool = True) -> None:
        self._count, self.costs, self.tag = count, costs, tag
        self.unit = set(costs.values()) == {1}  # every word one token
        self.tags_alike = tags_alike  # every tag counts the same whatever its hex: estimates may stand
        self._bases: dict[tuple[str | None, str], int] = {}

    @classmethod
    async def learn(cls, count: Count, vocabulary: Iterable[str], tag: str) -> WordModel:
        """Each word's cost after ``tag``: all at once when they are one token each, else one by one; and
        whether ``TAG_PROBES`` other tags count as ``tag`` does (a BPE tokenizer splits hex unevenly: then the
        model cannot stand for a prompt, whose tag is its own, and every prompt is counted)."""
        words = list(dict.fromkeys(vocabulary))
        alone = await count(None, tag)
        alike = all([await count(None, other) == alone for other in _other_tags(tag)])
        if await count(None, " ".join([tag, *words])) - alone == len(words):
            return cls(count, dict.fromkeys(words, 1), tag, alike)
        return cls(count, {w: await count(None, f"{tag} {w}") - alone for w in words}, tag, alike)

    async def count(self, system: str | None, user: str) -> int | None:
        user = normalized(user, self.tag)
        head = _TAG.match(user)
        opening, rest = (user[:head.end()], user[head.end():]) if head else _first_word(user)
        try:
            tail = sum(self.costs[w] for w in rest.split())
        except KeyError:
            return None
        return await self.base(system, opening) + tail

    async def base(self, system: str | None, opening: str) -> int:
        """The target's count of ``system`` and ``opening`` alone (tags normalized), measured once."""
        key = (normalized(system, self.tag) if system else None, normalized(opening, self.tag))
        if key not in self._bases:
            self._bases[key] = await self._count(*key)
        return self._bases[key]


def _other_tags(tag: str) -> list[str]:
    """``TAG_PROBES`` tags of ``tag``'s kind with other, fixed hex digits (letters and digits mixed)."""
    kind = tag.split(" ", 1)[0]
    return [f"{kind} {zlib.crc32(f'probe:{i}'.encode()):08x}{i:02x}:" for i in range(TAG_PROBES)]


def _first_word(text: str) -> tuple[str, str]:
    first, _, rest = text.partition(" ")
    return first, rest
