"""Prompts of an asked token length, and request bodies. Counting is injected (``TokenCounter``), so this
module stays pure apart from awaiting the counter.

A prompt is ``[shared system prompt] + unique tag + filler words``. The tag (random per request, seeded)
defeats accidental prefix-cache hits; ``shared_prefix_tokens`` puts the same system prompt in front of every
request of a class (``prefix_groups`` K: one of K system prompts, arrival i taking group i mod K), which a
prefix cache may serve; ``cache_bust`` puts the tag before the system prompt too, so nothing is shared. A
dataset class's prompt is its row's text as it is (plan/datasets.py); a conversation's later turn is its new
message, and ``request_body`` (plan/request_bodies.py) puts the history before it. The number of filler words
for a length comes from a linear fit ``tokens = a + b·words`` measured on the target, then each request is
checked and nudged until the counter agrees (exact where the counter is exact: the server's ``/tokenize`` or a
local tokenizer file): whole words first, then single-token padding words (``a``) for the last few tokens,
which whole words of 1–3 tokens cannot hit. A length shorter than the request's unique tag cannot be met: such
a prompt is the tag alone, and its real length is recorded. Where the counter is the server's ``/tokenize`` (a
round trip a count), prompts are nudged against a word model learned from it and a seeded sample is counted by
the server (plan/prompt_model.py; docs/metrics.md, Prompt lengths); a local counter counts every prompt.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from loadgen.core.apis import CHAT_LIKE
from loadgen.plan.datasets import class_rows
from loadgen.plan.request_bodies import History as History, request_body as request_body
from loadgen.plan.prompt_model import FIRST_VERIFIED, PromptStats, WordModel, sampled
from loadgen.plan.schedule import PlannedRequest
from loadgen.plan.scenario import RequestClass, Scenario
from loadgen.plan.session_bodies import session_tag
from loadgen.errors import ServerFault as ServerFault

WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community "
         "name president team minute idea kid body information back parent face others level office door "
         "health person art war history party result change morning reason research girl guy moment air "
         "teacher force education").split()
MAX_NUDGES = 8
PAD_WORD = "a"  # one token in every tokenizer we know of; fine-tunes the last few tokens


@dataclass(frozen=True, slots=True)
class Prompt:
    system: str | None  # the shared system prompt, if any
    user: str  # tag + filler
    tokens: int | None  # what the counter says the target will see (None: not checked)
    estimated: bool = False  # True: ``tokens`` is the word model's, not counted by the target (prompt_model.py)


class TokenCounter(Protocol):
    exact: bool  # (a counter with ``remote = True`` costs a round trip a count: prompts are then sampled)

    async def count(self, system: str | None, user: str) -> int: ...


def filler(words: int, rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=words))


def request_tag(seed: int, seq: int) -> str:
    return f"req {random.Random(f'tag:{seed}:{seq}').getrandbits(40):010x}:"


TAG_WORDS = len(request_tag(0, 0).split())


@dataclass
class LinearFit:
    base_tokens: float
    tokens_per_word: float

    def words_for(self, tokens: int) -> int:
        return max(0, round((tokens - self.base_tokens) / self.tokens_per_word))


async def fit(counter: TokenCounter, system: str | None, probe_words: int = 400) -> LinearFit:
    rng = random.Random(0)
    tag = request_tag(0, 0)
    small = await counter.count(system, tag)
    large = await counter.count(system, f"{tag} {filler(probe_words, rng)}")
    return LinearFit(small, max(0.1, (large - small) / probe_words))


class PromptFactory:
    def __init__(self, scenario: Scenario, counter: TokenCounter) -> None:
        self.scenario = scenario
        self.counter = counter
        self._classes = {c.name: c for c in scenario.workload.classes}
        self._fits: dict[str, LinearFit] = {}
        self._systems: dict[tuple[str, int], str | None] = {}
        self._per_word: float | None = None
        self._template_tokens: int | None = None  # what the chat template adds to a message (Mooncake blocks)
        self.model: WordModel | None = None  # a remote counter's: prompts are built against it, a sample counted
        self._learns = bool(getattr(counter, "remote", False) and counter.exact)
        self._learning = asyncio.Lock()
        self.stats = PromptStats()
        self._built: dict[str, int] = {}  # prompts built so far, by class (its first ones are all counted)

    def count_every_prompt(self) -> None:
        """Count every prompt on the counter, sampling none (where each length must be the target's own count:
        shrink's bodies)."""
        self._learns, self.model = False, None
        self.stats.policy = "every prompt"

    async def prepare_classes(self) -> None:
        """Build each class's (first) shared system prompt and fit words→tokens on the target."""
        for cls in self.scenario.workload.classes:
            if cls.dataset is None:
                self._fits[cls.name] = await fit(self.counter, await self._system(cls, 0))
        if any(c.conversation is not None or c.session is not None for c in self.scenario.workload.classes):
            self._fits[""] = await fit(self.counter, None)  # a later turn's message, counted alone

    async def _system(self, cls: RequestClass, group: int) -> str | None:
        """The shared system prompt of ``cls``'s prefix group ``group`` (made once, seeded)."""
        if cls.shared_prefix_tokens <= 0:
            return None
        if (cls.name, group) not in self._systems:
            if self._per_word is None:
                self._per_word = (await fit(self.counter, None)).tokens_per_word
            name = f"system:{self.scenario.seed}:{cls.name}" + (f":{group}" if group else "")
            words = max(1, round(cls.shared_prefix_tokens / self._per_word))
            self._systems[(cls.name, group)] = filler(words, random.Random(name))
        return self._systems[(cls.name, group)]

    async def build(self, req: PlannedRequest) -> Prompt:
        """A prompt of ``req.prompt_tokens`` as the target counts it: with the class's system prompt, or for a
        conversation's later turn its new message alone (the system prompt still goes first in its body). A
        dataset class's prompt is its row's text, counted. With ``cache_bust`` the request's unique tag opens
        the system prompt, so no two requests (nor two turns) share a prefix."""
        cls = self._classes[req.class_name]
        if self._learns and self.model is None:
            await self._learn()
        if cls.dataset is not None:
            return await self._from_row(cls, req)
        if req.blocks is not None:
            return await self._from_blocks(req)
        system, fresh = await self._system(cls, req.group), req.turn == 0 and req.context is None
        tag = session_tag(self.scenario.seed, cls, req) or (
            request_tag(self.scenario.seed, req.seq) if cls.cache_bust else None)
        system = _busted(system, tag) if tag else system
        prompt = await self._build(req, system if fresh else None, self._fits[req.class_name if fresh else ""])
        return Prompt(system, prompt.user, prompt.tokens, prompt.estimated)

    async def _learn(self) -> None:
        """The word model, learned on the counter at the first prompt's build (a failure is that prompt's)."""
        async with self._learning:
            if self.model is None:
                self.model = await WordModel.learn(self.counter.count, [*WORDS, PAD_WORD], request_tag(0, 0))
                self.stats.policy = "sampled" if self.model.tags_alike else "every prompt"

    async def _from_blocks(self, req: PlannedRequest) -> Prompt:
        """A Mooncake trace's request: block ``h``'s text is the same wherever hash id ``h`` appears (seeded by
        ``h``), so prompts that share leading hash ids share their leading text; the last block is cut so the
        prompt (the template's tokens included) has ``req.prompt_tokens`` tokens as the target counts them."""
        assert req.blocks is not None and (req.block_tokens or self.scenario.load.trace is not None)
        size = req.block_tokens or (self.scenario.load.trace.block_tokens if self.scenario.load.trace else 0)
        if self._template_tokens is None:
            self._template_tokens = await self.counter.count(None, PAD_WORD) - 1
        words = [w for h in req.blocks for w in _block_words(self.scenario.seed, h, size)]
        user = " ".join(words[:max(1, req.prompt_tokens - self._template_tokens)])
        tag = session_tag(self.scenario.seed, self._classes[req.class_name], req)  # a trace session's: its own
        return await self._counted(req, tag, user, tag)

    async def _from_row(self, cls: RequestClass, req: PlannedRequest) -> Prompt:
        assert cls.dataset is not None and req.row is not None
        row = class_rows(cls, self.scenario.target.api)[req.row]
        system, user = row.system, row.turns[req.turn]
        if cls.cache_bust:
            system = _busted(system, request_tag(self.scenario.seed, req.seq))
        return await self._counted(req, system, user, system if req.turn == 0 else None)

    def _to_count(self, req: PlannedRequest) -> bool:
        """Whether ``req``'s prompt is counted by the counter: always without a model (or once it missed), else
        each class's first ``FIRST_VERIFIED`` and the seeded sample (prompt_model.py)."""
        nth = self._built[req.class_name] = self._built.get(req.class_name, 0) + 1
        self.stats.built += 1
        # policy: "sampled" only while a learned model holds (tags alike, no miss yet: prompt_model.PromptStats)
        return self.stats.policy != "sampled" or nth <= FIRST_VERIFIED or sampled(self.scenario.seed, req.seq)

    async def _counted(self, req: PlannedRequest, system: str | None, user: str, counted_system: str | None) -> Prompt:
        """A prompt whose text is given (a dataset row, trace blocks): counted, or the model's estimate (None
        where the model has no cost for its words: not checked)."""
        estimate = await self.model.count(counted_system, user) if self.model is not None else None
        if not self._to_count(req):
            self.stats.estimated += 1
            return Prompt(system, user, estimate, estimated=True)
        count = await self.counter.count(counted_system, user)
        self.stats.counted += 1
        self.stats.check(estimate, count)
        return Prompt(system, user, count)

    async def _build(self, req: PlannedRequest, system: str | None, fit_: LinearFit) -> Prompt:
        """Filler words to ``req.prompt_tokens``: nudged against the word model (its sums, no text), then (when
        counted) against the counter from there, which then takes one count where the model is right."""
        rng = random.Random(f"filler:{self.scenario.seed}:{req.seq}")
        tag, start = request_tag(self.scenario.seed, req.seq), (fit_.words_for(req.prompt_tokens), 0)
        words, estimate = rng.choices(WORDS, k=start[0] + 64), None

        def text(n: int, pad: int) -> str:
            return " ".join([tag, *_take(words, n, rng), *[PAD_WORD] * pad])

        if self.model is not None:
            base, costs, unit = await self.model.base(system, tag), self.model.costs, self.model.unit

            async def by_model(n: int, pad: int) -> int:  # every word one token (the simulator's): no sum
                taken = _take(words, n, rng)
                return base + (len(taken) if unit else sum(costs[w] for w in taken)) + pad * costs[PAD_WORD]
            estimate, start = await self._nudge(req, fit_, start, by_model)
        if not self._to_count(req) and estimate is not None:
            self.stats.estimated += 1
            return Prompt(system, text(*start), estimate, estimated=True)

        counts: list[int] = []  # the first: the counter's at the model's answer

        async def by_counter(n: int, pad: int) -> int:
            counts.append(await self.counter.count(system, text(n, pad)))
            return counts[-1]
        count, end = await self._nudge(req, fit_, start, by_counter)
        self.stats.counted += 1
        self.stats.check(estimate, counts[0])  # a miss: every later prompt is counted
        return Prompt(system, text(*end), count)

    async def _nudge(self, req: PlannedRequest, fit_: LinearFit, start: tuple[int, int],
                     count_: Callable[[int, int], Awaitable[int]]) -> tuple[int, tuple[int, int]]:
        """Words then padding from ``start`` (words, pads) until ``count_`` says ``req.prompt_tokens``; the last
        count and where it stopped."""
        target, per_word = req.prompt_tokens, fit_.tokens_per_word
        n, pad = start
        for attempt in range(1, MAX_NUDGES + 1):
            count = await count_(n, pad)
            missing = target - count
            shortest = missing < 0 and n == 0 and pad == 0
            if missing == 0 or not self.counter.exact or attempt == MAX_NUDGES or shortest:
                return count, (n, pad)
            if missing < 0 and pad > 0:
                pad = max(0, pad + missing)  # drop padding before words
            elif missing < 0:
                n = max(0, n + min(-1, round(missing / per_word)))  # too long: fewer words, pad back up
            elif missing <= 2 * math.ceil(per_word):
                pad += missing
            else:
                n += max(1, round(missing / per_word))
        raise AssertionError("unreachable")


def _block_words(seed: int, block: int, size: int) -> list[str]:
    """Hash id ``block``'s text: ``size`` common words (one token each in most tokenizers)."""
    return random.Random(f"block:{seed}:{block}").choices(WORDS, k=size)


def _busted(system: str | None, tag: str) -> str:
    return f"{tag} {system}" if system else tag


def _take(words: list[str], n: int, rng: random.Random) -> list[str]:
    while len(words) < n:
        words.append(rng.choice(WORDS))
    return words[:n]


async def build_prompts(factory: PromptFactory, requests: list[PlannedRequest], concurrency: int = 16,
                        progress: Callable[[int], None] | None = None) -> dict[int, Prompt]:
    """Prompts for every planned request, checked against the counter with bounded concurrency."""
    out: dict[int, Prompt] = {}
    sem = asyncio.Semaphore(concurrency)

    async def one(req: PlannedRequest) -> None:
        async with sem:
            out[req.seq] = await factory.build(req)
            if progress:
                progress(1)
    tasks = [asyncio.ensure_future(one(r)) for r in requests]
    try:
        await asyncio.gather(*tasks)
    except BaseException:  # the first failure is the answer: the rest are cancelled and awaited, not left to
        for task in tasks:  # fail unretrieved (asyncio printed their tracebacks under the one-line exit 2)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return out


# ---- counters ------------------------------------------------------------------------------------------
PostJson = Callable[[str, dict[str, Any]], Awaitable[Any]]


def _messages(system: str | None, user: str) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


class TokenizeEndpointCounter:
    """Exact: the target's own tokenize endpoint, with the chat template applied, in its engine's dialect
    (``engines.DIALECTS``): vLLM's (and the simulator's, SGLang's) ``/tokenize`` or ``/v1/tokenize``;
    llama.cpp's ``/apply-template`` then ``/tokenize {content}``; TGI's ``/chat_tokenize`` or ``/tokenize
    {inputs}``."""

    exact = True
    remote = True  # a round trip a count: the factory counts a sample of prompts (plan/prompt_model.py)

    def __init__(self, post: PostJson, model: str, api: str, dialect: str = "vllm") -> None:
        self.post, self.model, self.api, self.dialect = post, model, api, dialect

    async def count(self, system: str | None, user: str) -> int:
        text = f"{system}\n{user}" if system else user
        if self.dialect == "llamacpp":
            if self.api in CHAT_LIKE:
                answer = await self.post("/apply-template", {"messages": _messages(system, user)})
                text = _read(answer, "/apply-template", lambda a: a["prompt"])
            answer = await self.post("/tokenize", {"content": text, "add_special": True, "parse_special": True})
            return _read(answer, "/tokenize", lambda a: len(a["tokens"]))
        if self.dialect == "tgi":
            if self.api in CHAT_LIKE:
                answer = await self.post("/chat_tokenize", {"model": self.model, "messages": _messages(system, user)})
                return _read(answer, "/chat_tokenize", lambda a: len(a["tokenize_response"]))
            return _read(await self.post("/tokenize", {"inputs": text}), "/tokenize", len)
        path = "/v1/tokenize" if self.dialect == "vllm_v1" else "/tokenize"
        body: dict[str, Any] = {"model": self.model, "prompt": text}
        if self.api in CHAT_LIKE:
            body = {"model": self.model, "messages": _messages(system, user), "add_generation_prompt": True}
        return _read(await self.post(path, body), path, lambda a: int(a["count"]))


_Read = TypeVar("_Read")


def _read(answer: Any, path: str, read: Callable[[Any], _Read]) -> _Read:
    """``read(answer)`` of a tokenize answer; ServerFault naming ``path`` when the answer has another shape (the
    server's fault, never a KeyError that would read as loadgen's bug)."""
    try:
        return read(answer)
    except (LookupError, TypeError, ValueError) as exc:
        raise ServerFault(f"{path} answered without what loadgen reads ({type(exc).__name__}: "
                          f"{str(exc)[:80]})") from None


class LocalTokenizerCounter:
    """Exact for the text: a local ``tokenizer.json`` (Hugging Face ``tokenizers``) plus the template's
    constant overhead, measured once from the server's ``usage``."""

    exact = True

    def __init__(self, path: str, template_overhead: int = 0) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path))
        self.template_overhead = template_overhead

    def count_text(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    async def count(self, system: str | None, user: str) -> int:
        text = f"{system}\n{user}" if system else user
        return self.count_text(text) + self.template_overhead


class UsageCalibratedCounter:
    """Approximate: ``base + tokens_per_word × words`` (every word of the prompt, the tag's too), fitted by
    ``calibrate`` from two probe requests' ``usage.prompt_tokens`` (no tokenizer at hand). Achieved lengths are
    still recorded per request from the server's usage."""

    exact = False

    def __init__(self, fit_: LinearFit) -> None:
        self.fit = fit_

    async def count(self, system: str | None, user: str) -> int:
        words = len(user.split()) + (len(system.split()) if system else 0)
        return round(self.fit.base_tokens + self.fit.tokens_per_word * words)


async def calibrate(probe: TokenCounter) -> UsageCalibratedCounter:
    """A calibrated counter from an exact but costly ``probe`` (a request per count): ``fit`` measures the tag
    alone and the words after it; the calibrated counter counts the tag's words too, so its base is less
    the tag's words."""
    measured = await fit(probe, None)
    return UsageCalibratedCounter(LinearFit(measured.base_tokens - TAG_WORDS * measured.tokens_per_word,
                                            measured.tokens_per_word))
