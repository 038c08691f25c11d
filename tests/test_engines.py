"""Engine adapters: recognising the engine, its /metrics in one vocabulary, exact prompt lengths through its
tokenize endpoint — each checked against the simulator speaking that engine's dialect."""

from __future__ import annotations

import polars as pl
import pytest

from loadgen.core import engines
from loadgen.core import prom_text
from tests.run_helpers import run_cli, summary

EXPOSITIONS = {  # trimmed from each engine's real /metrics text
    "vllm": 'vllm:num_requests_running{model_name="m"} 3.0\nvllm:num_requests_waiting{model_name="m"} 1.0\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\nvllm:num_preemptions_total{model_name="m"} 2.0\n',
    "sglang": '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 3.0\n'
              'sglang:num_queue_reqs{model_name="m"} 1.0\nsglang:token_usage{model_name="m"} 0.25\n'
              'sglang:prompt_tokens_total{model_name="m"} 900.0\n',
    "llamacpp": "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 900\n"
                "llamacpp:tokens_predicted_total 40\nllamacpp:n_decode_total 17\nllamacpp:requests_processing 3\n"
                "llamacpp:requests_deferred 1\n",
    "tgi": 'tgi_batch_current_size 3\ntgi_queue_size 1\ntgi_request_input_length_sum 900\n'
           'tgi_request_input_length_count 4\ntgi_request_generated_tokens_sum{} 40\n',
}


@pytest.mark.parametrize("engine", EXPOSITIONS)
def test_each_engines_metrics_are_recognised_and_mapped_to_one_vocabulary(engine):
    text = EXPOSITIONS[engine]
    assert engines.detect_from_metrics(text) == engine
    values = prom_text.parse(text)
    assert values["running"] == 3 and values["waiting"] == 1
    assert set(values) <= {"running", "waiting", "kv_cache_usage", "preemptions_total", "prompt_tokens_total",
                           "generation_tokens_total", "iteration_tokens_sum", "iteration_tokens_count", "steps_total"}


def test_an_unknown_exposition_names_no_engine():
    assert engines.detect_from_metrics("# HELP up\nup 1\nprocess_cpu_seconds_total 3\n") is None
    assert "unknown make" in engines.describe(None, "its /metrics", None)


@pytest.mark.parametrize("engine, tokenize", [("vllm", "vllm"), ("sglang", "vllm"), ("llamacpp", "llamacpp"),
                                              ("tgi", "tgi")])
@pytest.mark.slow
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_each_engine_is_named_and_its_prompt_lengths_are_exact(engine, tokenize, api, tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--no-progress", "--no-png", "--duration", "2",
                  "--set", f"target.simulator.engine={engine}", "--set", f"target.api={api}")
    assert res.returncode in (0, 1, 3), res.stderr
    s = summary(out)
    assert s["target"]["engine"] == engine and s["target"]["tokenize_endpoint"] == tokenize
    assert any(note.startswith(f"engine: {engines.ENGINES[engine].label} (recognised by its /metrics)")
               for note in s["notes"])
    req = pl.read_parquet(out / "requests.parquet")
    assert req.height >= 3 and (req["prompt_tokens"] == req["prompt_tokens_asked"]).all()
    assert set(req["prompt_tokens_source"]) == {"server"}  # usage agreed with the count
    names = set(pl.read_parquet(out / "server_metrics.parquet")["name"])
    assert {"running", "waiting", "prompt_tokens_total", "generation_tokens_total"} <= names
