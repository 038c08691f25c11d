"""Prompts of an exact token length, with each kind of counter."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import PlannedRequest
from loadgen.plan.workload import (LinearFit, LocalTokenizerCounter, PromptFactory, UsageCalibratedCounter, WORDS,
                              calibrate, filler, request_body, request_tag)


def _scenario(**cls) -> Scenario:
    return Scenario.model_validate({"name": "w", "load": {"arrival": "poisson", "rate_per_s": 1, "requests": 1},
                                    "workload": {"classes": [{"name": "a", "prompt_tokens": {"dist": "fixed",
                                                 "value": 50}, "output_tokens": {"dist": "fixed", "value": 5},
                                                 **cls}]}})


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    """A small BPE tokenizer trained offline (no hub): words split into sub-word pieces, like real ones."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    text = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] + ["req 0123456789abcdef:"]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.mark.parametrize("target", [30, 50, 333, 2000])
def test_local_tokenizer_gives_exact_lengths(tokenizer_file, target):
    counter = LocalTokenizerCounter(str(tokenizer_file), template_overhead=3)

    async def go():
        factory = PromptFactory(_scenario(), counter)
        await factory.prepare_classes()
        return await factory.build(PlannedRequest(4, 0, "a", target, 5, False))
    prompt = asyncio.run(go())
    assert prompt.tokens == target == counter.count_text(prompt.user) + 3


def test_a_length_below_the_unique_tag_gets_the_shortest_prompt(tokenizer_file):
    counter = LocalTokenizerCounter(str(tokenizer_file))

    async def go():
        factory = PromptFactory(_scenario(), counter)
        await factory.prepare_classes()
        return await factory.build(PlannedRequest(4, 0, "a", 3, 5, False))
    prompt = asyncio.run(go())
    assert prompt.user.endswith(":") and prompt.tokens == counter.count_text(prompt.user) > 3


def test_prompts_are_unique_per_request_and_share_the_system_prompt(tokenizer_file):
    counter = LocalTokenizerCounter(str(tokenizer_file))
    scenario = _scenario(shared_prefix_tokens=40)

    async def go():
        factory = PromptFactory(scenario, counter)
        await factory.prepare_classes()
        return [await factory.build(PlannedRequest(i, 0, "a", 120, 5, False)) for i in range(3)]
    a, b, c = asyncio.run(go())
    assert a.system == b.system == c.system and a.system
    assert len({a.user.split(":")[0], b.user.split(":")[0], c.user.split(":")[0]}) == 3  # unique tags first
    body = request_body(scenario, "m", scenario.workload.classes[0], a, 5, continuous_usage=True)
    assert body["messages"][0] == {"role": "system", "content": a.system}
    assert body["ignore_eos"] and body["min_tokens"] == 5 and body["stream_options"]["continuous_usage_stats"]


def test_usage_calibrated_counter_is_approximate():
    counter = UsageCalibratedCounter(LinearFit(base_tokens=10, tokens_per_word=1.3))
    assert not counter.exact
    assert asyncio.run(counter.count(None, "one two three four")) == round(10 + 1.3 * 4)


def test_calibration_from_usage_probes_matches_a_subword_tokenizer(tokenizer_file):
    """A server without /tokenize, emulated by a BPE of ~1.5 tokens a word: the calibrated counter agrees with
    the server at the tag alone and stays close on long prompts (it is a fit, not a tokenizer)."""
    server = LocalTokenizerCounter(str(tokenizer_file), template_overhead=7)
    counter = asyncio.run(calibrate(server))
    tag = request_tag(0, 0)
    assert asyncio.run(counter.count(None, tag)) == asyncio.run(server.count(None, tag))
    factory_prompt = " ".join([request_tag(3, 9), filler(300, random.Random(9))])  # as the factory builds them
    truth = asyncio.run(server.count(None, factory_prompt))
    assert asyncio.run(counter.count(None, factory_prompt)) == pytest.approx(truth, rel=0.05)
