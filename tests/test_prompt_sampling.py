"""Prompts on a remote counter (the server's /tokenize): built against the word model, a seeded sample counted by
the server, exact lengths kept; a model that misses makes every later prompt counted (plan/prompt_model.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from loadgen.plan.prompt_model import FIRST_VERIFIED, TAG_PROBES, VERIFY_ONE_IN, sampled
from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import PlannedRequest
from loadgen.plan.workload import PAD_WORD, WORDS, LocalTokenizerCounter, PromptFactory, build_prompts


def _scenario(**cls: object) -> Scenario:
    return Scenario.model_validate({"name": "w", "load": {"arrival": "poisson", "rate_per_s": 1, "requests": 1},
                                    "workload": {"classes": [{"name": "a", "prompt_tokens": {"dist": "fixed",
                                                 "value": 50}, "output_tokens": {"dist": "fixed", "value": 5},
                                                 **cls}]}})


class Remote:
    """A /tokenize stand-in: counts by ``tokens`` (the simulator's rule: a word, or one other character, is a
    token; a chat message adds 4, the generation prompt 2), and counts its calls."""

    exact, remote = True, True

    def __init__(self, tokens=None) -> None:
        self.calls = 0
        self.tokens = tokens or (lambda text: len(text.replace(":", " :").split()))

    async def count(self, system: str | None, user: str) -> int:
        self.calls += 1
        return self.of(system, user)

    def of(self, system: str | None, user: str) -> int:
        return 2 + sum(4 + self.tokens(m) for m in ([system] if system else []) + [user])


def _requests(n: int, lengths=(67, 120, 333, 1000)) -> list[PlannedRequest]:
    return [PlannedRequest(i, 0, "a", lengths[i % len(lengths)], 5, False) for i in range(n)]


def _build(factory: PromptFactory, requests: list[PlannedRequest]):
    async def go():
        await factory.prepare_classes()
        return await build_prompts(factory, requests)
    return asyncio.run(go())


def _long_words_split(text: str) -> int:  # a word over 6 letters is two tokens: words cost 1 or 2
    return sum(1 + (len(w) > 6) for w in text.replace(":", " :").split())


@pytest.mark.parametrize("tokens", [None, _long_words_split], ids=["simulator", "subword"])
@pytest.mark.parametrize("cls", [{}, {"shared_prefix_tokens": 40}, {"shared_prefix_tokens": 40, "cache_bust": True}])
def test_a_sample_is_counted_and_every_prompt_has_its_asked_length(cls, tokens):
    """On a tokenizer the word model describes (the simulator's; one splitting long words), the server counts
    each class's first 16 prompts and ~1 in 32 after, not every one, and every prompt has its asked length."""
    remote, n = Remote(tokens), 640
    factory = PromptFactory(_scenario(**cls), remote)
    prompts = _build(factory, _requests(n))
    truth = Remote(tokens)
    for seq, p in prompts.items():
        assert p.tokens == _requests(n)[seq].prompt_tokens == truth.of(p.system, p.user)
    assert factory.model is not None and factory.model.unit == (tokens is None)
    sample = sum(1 for r in _requests(n)[FIRST_VERIFIED:] if sampled(0, r.seq))
    st = factory.stats
    assert st.counted == FIRST_VERIFIED + sample and st.estimated == n - st.counted and st.missed == 0
    assert n / VERIFY_ONE_IN / 2 < sample < n / VERIFY_ONE_IN * 2  # the seeded share is about 1 in 32
    learning = 2 + TAG_PROBES + (0 if tokens is None else 101)  # the vocabulary at once, other tags, word by word
    assert remote.calls <= st.counted + learning + 6  # one count a counted prompt; + the fits', the bases
    assert [p.estimated for p in prompts.values()].count(False) == st.counted
    assert "the word model matched all" in (st.note() or "")


def test_the_prompts_are_the_ones_counting_every_prompt_builds():
    """The model changes how many counts a prompt costs, not which prompt it is: the same text, seed for seed."""
    requests = _requests(80)
    sampled_prompts = _build(PromptFactory(_scenario(shared_prefix_tokens=40), Remote()), requests)

    class Local(Remote):
        remote = False
    every = _build(PromptFactory(_scenario(shared_prefix_tokens=40), Local()), requests)
    assert {s: (p.system, p.user) for s, p in sampled_prompts.items()} == {
        s: (p.system, p.user) for s, p in every.items()}


def test_a_model_that_misses_makes_every_later_prompt_counted_and_exact():
    """A tokenizer whose tags all count alike but which merges context (a word repeated right after itself costs
    one token more, which no word alone shows): the model holds on the tag probe and on each word, the first
    counted prompt with such a pair shows it off, and from then on every prompt is counted, each exact."""
    def hex_costly(text: str) -> int:
        words = text.replace(":", " :").split()
        return len(words) + sum(a == b != PAD_WORD for a, b in zip(words, words[1:]))  # padding stays 1 each
    remote = Remote(hex_costly)
    factory = PromptFactory(_scenario(), remote)
    requests = _requests(200)
    prompts = _build(factory, requests)
    assert factory.model is not None and factory.model.tags_alike  # the miss rule, not the tag probe, decides
    st = factory.stats
    assert st.missed >= 1 and st.policy == "every prompt" and st.max_error_tokens >= 1
    truth = Remote(hex_costly)
    late = [p for s, p in prompts.items() if s >= FIRST_VERIFIED]
    assert all(not p.estimated and p.tokens == truth.of(p.system, p.user) for p in late)
    assert all(p.tokens == requests[s].prompt_tokens for s, p in prompts.items() if s >= FIRST_VERIFIED)
    assert "every prompt from the first miss on was counted" in (st.note() or "")


def test_count_every_prompt_counts_every_prompt_on_a_remote_counter():
    remote = Remote()
    factory = PromptFactory(_scenario(), remote)
    factory.count_every_prompt()
    prompts = _build(factory, _requests(40))
    assert factory.stats.counted == 40 and not any(p.estimated for p in prompts.values()) and factory.model is None
    assert all(p.tokens == _requests(40)[s].prompt_tokens for s, p in prompts.items())


def test_a_local_tokenizer_counts_every_prompt(tmp_path: Path):
    """A local tokenizer is exact and costs no round trip: no model, every prompt counted."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)] * 3, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    factory = PromptFactory(_scenario(), LocalTokenizerCounter(str(tmp_path / "tokenizer.json")))
    prompts = _build(factory, _requests(40, (60, 200)))
    assert factory.model is None and factory.stats.counted == 40 and factory.stats.estimated == 0
    assert all(not p.estimated and p.tokens == (60, 200)[s % 2] for s, p in prompts.items())
    assert factory.stats.note() is None


@pytest.mark.slow
def test_a_closed_loop_run_records_how_its_prompt_lengths_were_had(tmp_path: Path):
    """Against the embedded simulator (its /tokenize: one token per word): a closed loop past the sample's start
    sends most prompts on the model's estimate, and run.json's ``prompts`` and notes say so."""
    from tests.run_helpers import run_cli

    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--no-progress", "--no-png",
                  "--set", "load.arrival=concurrency", "--set", "load.concurrency=4", "--set", "load.requests=60",
                  "--set", "load.duration_s=60", "--set", "load.warmup_s=0")
    assert res.returncode in (0, 1, 3), res.stdout + res.stderr
    info = json.loads((out / "run.json").read_text())
    stats = info["prompts"]
    assert stats["built"] == 60 and stats["missed"] == 0 and stats["policy"] == "sampled"
    assert stats["counted"] + stats["estimated"] == 60 and stats["estimated"] >= 60 - FIRST_VERIFIED - 60 // VERIFY_ONE_IN - 1
    assert any(n.startswith("prompt lengths: ") and "estimates" in n for n in info["notes"])


def test_a_tokenizer_that_splits_the_tags_hex_unevenly_has_every_prompt_counted():
    """A BPE tokenizer counts each request's hex tag its own way (the tiny vLLM model's missed by a token on
    estimated prompts): the model then cannot stand for any prompt, and every one is counted, exact."""
    def hex_in_pieces(text: str) -> int:  # a hex run costs one token per letter a-f it holds, besides
        return sum(1 + sum(c in "abcdef" for c in w) if w.endswith(":") else 1
                   for w in text.replace(":", ": ").split())
    remote = Remote(hex_in_pieces)
    factory = PromptFactory(_scenario(), remote)
    n = 80
    prompts = _build(factory, _requests(n))
    assert factory.model is not None and not factory.model.tags_alike
    assert factory.stats.counted == n and factory.stats.estimated == 0 and factory.stats.policy == "every prompt"
    truth = Remote(hex_in_pieces)
    assert all(p.tokens == _requests(n)[seq].prompt_tokens == truth.of(p.system, p.user) for seq, p in prompts.items())
