"""Real traffic shapes: Mooncake traces replayed with their prefix sharing, and ramped arrivals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from loadgen import api
from loadgen.plan.arrivals import ramp_time_s
from loadgen.plan.sample_dataset import mooncake_jsonl
from loadgen.plan.scenario import Ramp, Scenario
from loadgen.plan.scenario_file import load_scenario
from loadgen.plan.schedule import build_plan
from tests.run_helpers import ROOT, records, run_cli


def _trace_scenario(tmp_path: Path, rows: list[dict], **trace) -> Path:
    data = tmp_path / "trace.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "mc", "target": {"simulator": {"prefix_caching": True, "block_size_tokens": 16}},
        "load": {"arrival": "trace", "trace": {"path": str(data), "format": "mooncake", **trace}},
        "workload": {"classes": [{"name": "t", "prompt_tokens": {"dist": "fixed", "value": 1},
                                  "output_tokens": {"dist": "fixed", "value": 1}}]}}))
    return path


ROWS = [{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 1000, "input_length": 1500, "output_length": 6, "hash_ids": [1, 2, 3]},
        {"timestamp": 2000, "input_length": 1000, "output_length": 7, "hash_ids": [4, 5]},
        {"timestamp": 3000, "input_length": 1000, "output_length": 8, "hash_ids": [1, 9]}]


def test_a_mooncake_trace_keeps_its_times_lengths_and_blocks():
    s = Scenario.model_validate({"name": "x", "load": {"arrival": "trace", "trace": {
        "path": str(ROOT / "scenarios" / "data" / "mooncake_sample.jsonl"), "format": "mooncake", "speedup": 2}},
        "workload": {"classes": [{"name": "t", "prompt_tokens": {"dist": "fixed", "value": 1},
                                  "output_tokens": {"dist": "fixed", "value": 1}}]}})
    plan = build_plan(s)
    rows = [json.loads(line) for line in mooncake_jsonl().splitlines()]
    assert len(plan.requests) == len(rows) == 120
    first = rows[0]["timestamp"]
    for req, row in zip(plan.requests, rows):
        assert req.t_intended_offset_ns == pytest.approx((row["timestamp"] - first) / 2 * 1e6, abs=1)
        assert (req.prompt_tokens, req.output_tokens, list(req.blocks)) == \
            (row["input_length"], row["output_length"], row["hash_ids"])
    assert (ROOT / "scenarios" / "data" / "mooncake_sample.jsonl").read_text() == mooncake_jsonl()


def test_shared_hash_ids_become_shared_prompt_text_that_the_server_caches(tmp_path):
    result = api.run(load_scenario(_trace_scenario(tmp_path, ROWS)), out=tmp_path / "run")
    assert result.requests["completed"] == 4, result.reasons
    requests = records(tmp_path / "run")[0].sort("seq")
    assert requests["prompt_tokens"].to_list() == [1024, 1500, 1000, 1000]  # exact, template included
    assert requests["output_tokens"].to_list() == [5, 6, 7, 8]
    # 1: request 0's whole prompt (its 1,020 tokens before the answer) → 1,008 in whole blocks of 16
    # 2: nothing shared; 3: hash id 1's block (2 template tokens + 512) → 512
    assert requests["cached_tokens"].to_list() == [0, 1008, 0, 512]


@pytest.mark.parametrize("row, message", [
    ({"timestamp": 0, "input_length": 10, "output_length": 5}, "hash_ids"),
    ({"timestamp": 0, "input_length": 2000, "output_length": 5, "hash_ids": [1]}, "do not fill 1 blocks of 512"),
])
def test_a_bad_trace_row_is_one_line_and_exit_2(tmp_path, row, message):
    proc = run_cli("run", str(_trace_scenario(tmp_path, [row])), "--out", str(tmp_path / "never"))
    assert proc.returncode == 2 and message in proc.stderr and "row 1" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# ---- ramps ----------------------------------------------------------------------------------------------
def _ramp_plan(duration_s: float = 100, **ramp) -> list[float]:
    s = Scenario.model_validate({"name": "r", "seed": 9, "load": {"arrival": "ramp", "duration_s": duration_s,
                                                                  "ramp": ramp},
                                 "workload": {"classes": [{"name": "a", "prompt_tokens": {"dist": "fixed",
                                               "value": 5}, "output_tokens": {"dist": "fixed", "value": 5}}]}})
    return build_plan(s).offsets_s


@pytest.mark.parametrize("shape", ["linear", "exponential"])
def test_a_ramp_sends_at_its_rate_over_time(shape):
    ramp = Ramp(start_rate_per_s=1, end_rate_per_s=9, shape=shape)
    offsets = _ramp_plan(1000, start_rate_per_s=1, end_rate_per_s=9, shape=shape)
    assert len(offsets) == pytest.approx(ramp.mean_rate_per_s() * 1000, rel=0.05)
    for lo in (0, 250, 500, 750):  # each quarter holds Λ(hi) − Λ(lo) arrivals (hundreds: within 20 %, ~4 sd)
        expected = _cumulative(ramp, lo + 250, 1000) - _cumulative(ramp, lo, 1000)
        assert sum(lo <= t < lo + 250 for t in offsets) == pytest.approx(expected, rel=0.2)


def _cumulative(ramp: Ramp, t: float, horizon: float = 100) -> float:
    r0, r1 = ramp.start_rate_per_s, ramp.end_rate_per_s
    if ramp.shape == "linear":
        return r0 * t + (r1 - r0) * t * t / (2 * horizon)
    k = math.log(r1 / r0)
    return r0 * horizon / k * (math.exp(k * t / horizon) - 1)


def test_an_even_ramp_is_deterministic_and_its_inverse_is_exact():
    offsets = _ramp_plan(start_rate_per_s=10, end_rate_per_s=2, poisson=False)
    assert len(offsets) == 600 and all(b > a for a, b in zip(offsets, offsets[1:]))
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert gaps[0] == pytest.approx(0.1, rel=0.01) and gaps[-1] == pytest.approx(0.5, rel=0.02)  # 1 / rate
    ramp = Ramp(start_rate_per_s=2, end_rate_per_s=20, shape="exponential")
    for t in (0.0, 13.0, 77.0, 100.0):
        assert ramp_time_s(ramp, 100, _cumulative(ramp, t)) == pytest.approx(t, abs=1e-9)


def test_a_ramp_needs_its_block_and_a_duration(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "r", "load": {"arrival": "ramp", "duration_s": 5},
                                    "workload": {"classes": [{"name": "a", "prompt_tokens": {"dist": "fixed",
                                                 "value": 5}, "output_tokens": {"dist": "fixed", "value": 5}}]}}))
    proc = run_cli("run", str(path), "--out", str(tmp_path / "never"))
    assert proc.returncode == 2 and "needs load.ramp" in proc.stderr
