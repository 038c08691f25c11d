"""``loadgen run`` without a scenario file (plan/quick.py, cli/run.py): each quick-start flag lands on its
scenario field, as the loader validates it; lists and contradictions are refused (exit 2, nothing sent); the
missing-/v1 habit is retried and said, a redirect is not. The runner is replaced by a recorder of the scenario
it is given: these tests hold the flags to the scenario, the runs themselves are tested elsewhere."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
from typer.testing import CliRunner

from loadgen import api
from loadgen.cli import run as run_cmd
from loadgen.cli.app import app
from loadgen.plan import bundled, quick
from loadgen.run.prepare import open_client
from loadgen.run.target import TargetError, auth_headers, resolve
from tests.run_helpers import ROOT
from tests.shape_server import ShapeServer


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[api.Scenario]:
    """The scenarios ``loadgen run`` would have run (its exit code: 0)."""
    seen: list[api.Scenario] = []

    def record(sc: api.Scenario, **_: Any) -> Any:
        seen.append(sc)
        return SimpleNamespace(exit_code=0)

    monkeypatch.setattr(api, "run", record)  # cli/run.py imports it when it runs
    return seen


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["run", *args], env={"COLUMNS": "120"})


def one(runs: list[api.Scenario], *args: str) -> api.Scenario:
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    return runs[-1]


def dist(d: Any) -> dict[str, Any]:
    return {k: v for k, v in d.model_dump().items() if v is not None}


def test_the_defaults_of_a_quick_start(runs: list[api.Scenario]) -> None:
    res = invoke("--base-url", "http://h:8000/v1")
    assert res.exit_code == 0, res.output
    sc = runs[-1]
    assert (sc.target.base_url, sc.target.model, sc.target.api) == ("http://h:8000/v1", "auto", "chat")
    assert (sc.load.arrival, sc.load.rate_per_s, sc.load.duration_s, sc.load.warmup_s) == ("poisson", 1, 30, 0)
    (cls,) = sc.workload.classes
    assert dist(cls.prompt_tokens)["value"] == 512 and dist(cls.output_tokens)["value"] == 128
    assert dist(cls.prompt_tokens)["dist"] == "fixed"
    assert sc.slo.error_rate is not None and sc.slo.error_rate.max == 0
    assert "SLO: no failed request" in res.stdout


def test_the_issue_command_and_the_vllm_bench_names(runs: list[api.Scenario]) -> None:
    """--input-len/--output-len are the permanent second names of --prompt-tokens/--output-tokens."""
    bench = one(runs, "--base-url", "http://h:8000", "--model", "m", "--rate", "4", "--input-len", "300",
                "--output-len", "40", "--duration", "20")
    ours = one(runs, "--base-url", "http://h:8000", "--model", "m", "--rate", "4", "--prompt-tokens", "300",
               "--output-tokens", "40", "--duration", "20s")
    assert bench.model_dump() == ours.model_dump()
    assert (bench.load.rate_per_s, bench.load.duration_s, bench.target.model) == (4, 20, "m")
    cls = bench.workload.classes[0]
    assert (dist(cls.prompt_tokens)["value"], dist(cls.output_tokens)["value"]) == (300, 40)


def test_concurrency_is_a_closed_loop(runs: list[api.Scenario]) -> None:
    sc = one(runs, "--base-url", "embedded", "--concurrency", "8")
    assert (sc.load.arrival, sc.load.concurrency, sc.load.rate_per_s) == ("concurrency", 8, None)


@pytest.mark.parametrize("spread, prompt, output", [
    ("10%", {"dist": "uniform", "min": 450, "max": 550}, {"dist": "uniform", "min": 90, "max": 110}),
    ("0%", {"dist": "fixed", "value": 500}, {"dist": "fixed", "value": 100})])
def test_spread_bounds(runs: list[api.Scenario], spread: str, prompt: dict[str, Any], output: dict[str, Any]) -> None:
    sc = one(runs, "--base-url", "embedded", "--prompt-tokens", "500", "--output-tokens", "100", "--spread", spread)
    cls = sc.workload.classes[0]
    assert {k: dist(cls.prompt_tokens)[k] for k in prompt} == prompt
    assert {k: dist(cls.output_tokens)[k] for k in output} == output


@pytest.mark.parametrize("args, says", [
    (["--rate", "1,2,4"], "a list of rates is a sweep: loadgen sweep --rate 1,2,4"),
    (["--concurrency", "1,2"], "loadgen sweep --concurrency 1,2"),
    (["--concurrency", "2.5"], "whole number"),
    (["--rate", "2", "--concurrency", "3"], "give one"),
    (["--spread", "10"], "--spread 10%"),
    (["--spread", "100%"], "below 100%"),
    (["--slo", "ttft_ms=200"], "METRIC.STAT=LIMIT"),
    (["--slo", "ttft_ms.p99=fast"], "not a number"),
    (["--dataset", "sharegpt-sample", "--prompt-tokens", "9"], "give one"),
    (["--rate", "0"], "--rate"),
    (["--slo", "ttft_ms.p9=100"], "--slo ttft_ms.p9=100: slo.ttft_ms.p9"),  # the flag named, the field meant
    (["--prompt-tokens", "9", "--dataset", "x.jsonl", "--output-tokens", "3"], "give one"),
    (["--api", "embeddingz"], "chat or completions")])
def test_refused_before_anything_is_sent(runs: list[api.Scenario], args: list[str], says: str) -> None:
    res = invoke("--base-url", "embedded", *args)
    assert res.exit_code == 2 and says in " ".join(res.output.split()), res.output
    assert runs == [] and "SLO: no failed request" not in res.output


def test_no_argument_explains_itself(runs: list[api.Scenario]) -> None:
    res = invoke()
    assert res.exit_code == 2 and runs == []
    for line in ("--base-url http://host:8000/v1 --model M --rate 4", "loadgen scenario list",
                 "loadgen run long_context", "loadgen run my_scenario.yaml"):
        assert line in res.output
    assert max(len(line) for line in run_cmd.NO_ARGUMENT.splitlines()) <= 80


def test_slo_flags(runs: list[api.Scenario]) -> None:
    res = invoke("--base-url", "embedded", "--slo", "ttft_ms.p99=2000", "--slo", "error_rate.max=1%")
    assert res.exit_code == 0, res.output
    slo = runs[-1].slo
    assert slo.ttft_ms is not None and slo.ttft_ms.p99 == 2000
    assert slo.error_rate is not None and slo.error_rate.max == pytest.approx(0.01)
    assert "SLO: no failed request" not in res.stdout


def test_dataset_paths(runs: list[api.Scenario], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = one(runs, "--base-url", "embedded", "--dataset", "sharegpt-sample")
    cls = sc.workload.classes[0]
    assert cls.dataset is not None and cls.dataset.path == bundled.folder() / "data/sharegpt_sample.json"
    assert cls.prompt_tokens is None and cls.output_tokens is None  # the rows' own answer lengths
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n')
    monkeypatch.chdir(tmp_path)  # a relative path is the caller's, not the temporary scenario's
    cls = one(runs, "--base-url", "embedded", "--dataset", "p.jsonl", "--output-tokens", "7").workload.classes[0]
    assert cls.dataset is not None and cls.dataset.path == tmp_path / "p.jsonl"
    assert dist(cls.output_tokens)["value"] == 7


def test_flags_override_a_scenario_file(runs: list[api.Scenario]) -> None:
    smoke = api.load_scenario(ROOT / "scenarios/smoke.yaml")
    sc = one(runs, str(ROOT / "scenarios/smoke.yaml"), "--rate", "9", "--output-tokens", "50")
    assert sc.load.rate_per_s == 9 and dist(sc.workload.classes[0].output_tokens)["value"] == 50
    assert sc.workload.classes[0].prompt_tokens == smoke.workload.classes[0].prompt_tokens
    assert sc.slo == smoke.slo  # the file's objectives stay; no default added
    assert one(runs, "--base-url", "embedded", "--rate", "4", "--set", "load.rate_per_s=7").load.rate_per_s == 7
    res = invoke(str(ROOT / "scenarios/sharegpt.yaml"), "--output-tokens", "9")
    assert res.exit_code == 2 and "2 request classes" in res.output and "--set workload.classes" in res.output
    assert one(runs, str(ROOT / "scenarios/sharegpt.yaml"), "--rate", "2").load.rate_per_s == 2


def test_a_bundled_scenario_by_name(runs: list[api.Scenario], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = invoke("long_context", "--duration", "5")
    assert res.exit_code == 0, res.output
    assert runs[-1].name == "long_context" and runs[-1].load.duration_s == 5
    assert "loadgen scenario copy long_context" in " ".join(res.output.split())  # wrapped at the console's width
    assert invoke("no_such_scenario").exit_code == 2


def test_quick_yaml_lengths_are_the_defaults() -> None:
    assert quick.lengths(512, None) == {"dist": "fixed", "value": 512}
    assert quick.lengths(3, 0.1) == {"dist": "fixed", "value": 3}  # ±0.3 token rounds away
    assert quick.slo_override("itl_ms.p50=50") == "slo.itl_ms.p50=50.0"


# ---- the missing /v1 -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shapes() -> Iterator[ShapeServer]:
    with ShapeServer() as srv:
        yield srv


def resolve_at(base_url: str) -> Any:
    sc = api.load_scenario(ROOT / "scenarios/smoke.yaml", [f"target.base_url={base_url}"])

    async def go() -> Any:
        async with open_client(sc, base_url) as client:
            headers, redact = auth_headers(sc)
            return await resolve(sc, client, base_url, headers, redact)
    return asyncio.run(go())


def test_a_base_url_without_v1_is_retried_silently(shapes: ShapeServer) -> None:
    """The README says /v1 is optional: a URL without it that works at /v1 is no note (issue 50)."""
    bare = shapes.url("ok").removesuffix("/v1")
    target = resolve_at(bare)
    assert target.base_url == bare + "/v1" and target.model == "m"
    assert not any("/models" in n or "404" in n for n in target.notes), target.notes


def test_no_model_list_at_either_names_both(shapes: ShapeServer) -> None:
    bare = f"http://127.0.0.1:{shapes.port}/nothing/here"
    with pytest.raises(TargetError, match=r"here/models: HTTP 404, and .*here/v1/models: HTTP 404"):
        resolve_at(bare)


def test_a_redirect_stays_exit_2(shapes: ShapeServer) -> None:
    bare = shapes.url("redirect-301").removesuffix("/v1")
    with pytest.raises(TargetError, match="301"):
        resolve_at(bare)
    res = CliRunner().invoke(app, ["check", "--base-url", bare])  # the command line: one line, exit 2
    assert res.exit_code == 2 and "301" in res.output, res.output
