"""Prompts from files (JSONL, CSV, Parquet, ShareGPT, a saved Hugging Face dataset), shared prefixes and
cache-busting, each run against the simulator, whose tokenizer tells exactly what reached it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from local_target.sim import tokenizer
from loadgen import api
from loadgen.plan.datasets import rows_for
from loadgen.plan.sample_dataset import sample_json
from loadgen.plan.scenario import DatasetSpec, ScenarioError
from loadgen.plan.scenario_file import load_scenario
from loadgen.plan.schedule import build_plan
from tests.run_helpers import ROOT, records, run_cli

TEXTS = ["Tell me about the sea, please.", "Why is the sky blue?", "Write a haiku about autumn leaves.",
         "Summarize: " + "the quick brown fox jumps over the lazy dog. " * 30]


def _chat_tokens(messages: list[dict[str, str]]) -> int:
    return len(tokenizer.chat_tokens(messages))


def _write_scenario(tmp_path: Path, cls: dict[str, Any], requests: int = 12, **sim: Any) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "ds", "seed": 2, "target": {"simulator": {"time_scale": 0.1, **sim}},
        "load": {"arrival": "poisson", "rate_per_s": 20, "requests": requests},
        "workload": {"classes": [{"name": "d", **cls}]}}))
    return path


def _run(path: Path, tmp_path: Path) -> pl.DataFrame:
    result = api.run(load_scenario(path), out=tmp_path / "run")
    assert result.requests["failed"] == 0, result.reasons
    return records(tmp_path / "run")[0]


# ---- each format, against the simulator -----------------------------------------------------------------
def test_jsonl_prompts_reach_the_server_as_written_with_the_recorded_output_lengths(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"text": t, "n": 5 + i}) + "\n" for i, t in enumerate(TEXTS)))
    requests = _run(_write_scenario(tmp_path, {"dataset": {"path": str(data), "prompt_column": "text",
                                                           "output_column": "n"}}), tmp_path)
    expected = {_chat_tokens([{"role": "user", "content": t}]): 5 + i for i, t in enumerate(TEXTS)}
    pairs = set(zip(requests["prompt_tokens"].to_list(), requests["output_tokens"].to_list()))
    assert pairs <= set(expected.items()) and len(pairs) >= 3


def test_csv_messages_column_keeps_the_system_prompt(tmp_path):
    data = tmp_path / "m.csv"
    rows = [[{"role": "system", "content": "You are terse."}, {"role": "user", "content": t}] for t in TEXTS]
    pl.DataFrame({"msgs": [json.dumps(r) for r in rows], "answer": ["one two three"] * len(rows)}).write_csv(data)
    requests = _run(_write_scenario(tmp_path, {"dataset": {"path": str(data), "messages_column": "msgs",
                                                           "output_column": "answer"}}), tmp_path)
    assert set(requests["prompt_tokens"].to_list()) <= {_chat_tokens(r) for r in rows}
    assert set(requests["output_tokens"].to_list()) == {3}  # "one two three": its length, estimated


def test_parquet_prompts_with_output_lengths_from_a_distribution(tmp_path):
    data = tmp_path / "p.parquet"
    pl.DataFrame({"prompt": TEXTS}).write_parquet(data)
    requests = _run(_write_scenario(tmp_path, {"dataset": {"path": str(data)},
                                               "output_tokens": {"dist": "fixed", "value": 9}}), tmp_path)
    assert set(requests["prompt_tokens"].to_list()) <= {_chat_tokens([{"role": "user", "content": t}])
                                                        for t in TEXTS}
    assert set(requests["output_tokens"].to_list()) == {9}


def _sharegpt(tmp_path: Path) -> Path:
    convs = [{"conversations": [{"from": "gpt", "value": "Hello! How can I help?"},  # a leading answer: dropped
                                {"from": "human", "value": f"question {i} one"}, {"from": "gpt", "value": "a b c"},
                                {"from": "human", "value": f"question {i} two"}, {"from": "gpt", "value": "d e"},
                                {"from": "human", "value": f"question {i} three"}]}  # no answer: not replayed
             for i in range(3)]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    return path


def test_sharegpt_conversations_replay_their_turns_with_the_answers_received(tmp_path):
    path = _write_scenario(tmp_path, {"dataset": {"path": str(_sharegpt(tmp_path))},
                                      "conversation": {"think_time_s": 0.05}}, requests=4, prefix_caching=True,
                           block_size_tokens=4)
    requests = _run(path, tmp_path).sort("conversation", "turn")
    assert requests.group_by("conversation").len()["len"].to_list() == [2] * 4  # turn 3 had no recorded answer
    assert requests["output_tokens"].to_list() == [3, 2] * 4  # the recorded answers' lengths
    answer = "".join(tokenizer.output_token(i) for i in range(3))  # what the simulator answered turn 0
    first = [{"role": "user", "content": "question 0 one"}]
    history = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "question 0 two"}]
    for _, turns in requests.group_by("conversation"):
        assert turns["prompt_tokens"].to_list() == [_chat_tokens(first), _chat_tokens(history)]
    # turn 1 finds turn 0's prompt and answer in the cache: 9 + 3 tokens, three whole blocks of 4
    assert min(requests.filter(pl.col("turn") == 1)["cached_tokens"].to_list()) >= 12


def test_a_saved_hugging_face_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"question": TEXTS, "answer": ["x y"] * len(TEXTS)}).save_to_disk(tmp_path / "hf")
    requests = _run(_write_scenario(tmp_path, {"dataset": {"path": str(tmp_path / "hf"), "prompt_column":
                                                           "question", "output_column": "answer"}}), tmp_path)
    assert set(requests["prompt_tokens"].to_list()) <= {_chat_tokens([{"role": "user", "content": t}])
                                                        for t in TEXTS}


# ---- sampling, filtering, bad input ---------------------------------------------------------------------
def test_rows_are_filtered_by_estimated_length_and_drawn_in_order_or_by_the_seed(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": t, "n": 4}) + "\n" for t in TEXTS))
    spec = DatasetSpec(path=data, output_column="n", max_prompt_tokens=20)
    assert len(rows_for(spec, need_answers=True)) == 3  # the long "Summarize" row is out
    for sample, check in (("sequential", lambda rows: rows == [0, 1, 2, 0, 1, 2]),
                          ("random", lambda rows: set(rows) == {0, 1, 2})):
        path = _write_scenario(tmp_path, {"dataset": {"path": str(data), "output_column": "n",
                                                      "max_prompt_tokens": 20, "sample": sample}}, requests=6)
        assert check([r.row for r in build_plan(load_scenario(path)).requests])


@pytest.mark.parametrize("content, cls, message", [
    ('{"text": "hi"}\n', {"output_tokens": {"dist": "fixed", "value": 3}}, "has no column 'prompt'"),
    ('{"prompt": "hi"}\n{not json\n', {"output_tokens": {"dist": "fixed", "value": 3}}, "not valid jsonl"),
    ('{"prompt": "hi"}\n', {}, "no row has a recorded answer"),
    ('{"prompt": "hi", "n": 3}\n', {"prompt_tokens": {"dist": "fixed", "value": 3}}, "drop prompt_tokens"),
])
def test_a_bad_dataset_is_one_line_and_exit_2_before_anything_is_sent(tmp_path, content, cls, message):
    data = tmp_path / "p.jsonl"
    data.write_text(content)
    path = _write_scenario(tmp_path, {"dataset": {"path": str(data), **({"output_column": "n"} if "n" in content
                                                                     else {})}, **cls})
    proc = run_cli("run", str(path), "--out", str(tmp_path / "never"))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "never").exists()


def test_a_missing_dataset_file_is_named(tmp_path):
    path = _write_scenario(tmp_path, {"dataset": {"path": "nowhere.jsonl"}})
    with pytest.raises(ScenarioError, match="dataset.path: no such file: .*nowhere.jsonl"):
        load_scenario(path)


def test_the_bundled_sample_is_what_the_generator_writes():
    assert (ROOT / "scenarios" / "data" / "sharegpt_sample.json").read_text() == sample_json()
    proc = run_cli("dataset", "inspect", str(ROOT / "scenarios" / "data" / "sharegpt_sample.json"))
    assert proc.returncode == 0 and "sharegpt, 100 rows" in proc.stdout


# ---- shared prefixes and cache-busting ------------------------------------------------------------------
@pytest.mark.parametrize("bust", [False, True])
def test_prefix_groups_share_a_cached_system_prompt_unless_busted(tmp_path, bust):
    cls = {"prompt_tokens": {"dist": "fixed", "value": 300}, "output_tokens": {"dist": "fixed", "value": 4},
           "shared_prefix_tokens": 200, "prefix_groups": 3, "cache_bust": bust}
    requests = _run(_write_scenario(tmp_path, cls, requests=15, prefix_caching=True, block_size_tokens=16),
                    tmp_path)
    assert set(requests["prompt_tokens"].to_list()) == {300}
    cached = requests.sort("seq")["cached_tokens"].to_list()
    if bust:
        assert set(cached) == {0}
    else:  # the first request of each group computes its system prompt; the next ones find it cached
        assert cached[:3] == [0, 0, 0] and min(cached[3:]) >= 176 and max(cached) < 220
