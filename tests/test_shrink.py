"""``loadgen shrink``: ddmin on pure predicates; the shrink of a replay-made run in virtual time (the simulator's
own scheduler, so the answer is known: a victim and the long prompt whose prefill stalled it); the standalone
script (stdlib only; its embedded bodies have the exact prompt lengths by the simulator's tokenizer, prepared in
process; against the real-time simulator in the ``slow`` tests); bad input exits 2."""

from __future__ import annotations

import ast
import asyncio
import base64
import importlib.util
import json
import zlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from loadgen.cli.app import app
from loadgen.core.secrets import REDACTOR
from loadgen.plan.scenario_file import load_scenario
from loadgen.plan.arrivals import read_trace_file
from loadgen.plan.schedule import build_plan
from loadgen.plan.workload import PromptFactory, TokenizeEndpointCounter
from loadgen.run.prepare import Prepared
from loadgen.run.target import ResolvedTarget
from loadgen.shrink.bodies import Bodies, build_bodies, prepared_bodies
from loadgen.shrink.confirm import confirm
from loadgen.shrink.ddmin import ddmin
from loadgen.shrink.event import Event, Item, worst_stall
from loadgen.shrink.search import ShrinkOptions, shrink
from loadgen.shrink.writers import prompts_line, script_text
from local_target.sim import build_config
from local_target.sim.openai_api import tokenize_response
from local_target.sim.tokenizer import chat_tokens

sys.path.insert(0, str(Path(__file__).parent))
from virtual_truth import virtual_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


# ---- ddmin -------------------------------------------------------------------------------------------------
def test_ddmin_finds_a_two_element_cause_in_64_items_within_the_bound() -> None:
    asked: list[tuple[int, ...]] = []

    def test(cand: tuple[int, ...]) -> tuple[bool, float]:
        asked.append(cand)
        return {17, 50} <= set(cand), float(len(cand))

    found = ddmin(list(range(64)), 0, test, max_tries=200)
    assert found.items == (0, 17, 50) and found.stopped == ""
    assert len(found.tries) == len(asked) <= 60  # ddmin's bound for a 2-element cause: O(2 · 2 · log2 64) tries
    assert all(0 in cand for cand in asked), "the victim is in every candidate"
    assert len(set(asked)) == len(asked), "no set is tried twice"
    assert found.failing()[0] == (0, 17, 50)


def test_ddmin_keeps_the_victim_when_the_cause_is_elsewhere() -> None:
    found = ddmin(list(range(10)), 9, lambda c: (3 in c, 0.0), max_tries=100)
    assert found.items == (3, 9)


def test_ddmin_stops_at_max_tries_and_at_the_deadline_with_the_smallest_failing_set() -> None:
    found = ddmin(list(range(64)), 0, lambda c: ({17, 50} <= set(c), 0.0), max_tries=8)
    assert found.stopped == "max tries" and len(found.tries) == 8
    assert {17, 50} <= set(found.items) and len(found.items) < 64
    ticks = iter(range(100))
    timed = ddmin(list(range(64)), 0, lambda c: ({17, 50} <= set(c), 0.0), max_tries=200, deadline=3,
                  clock=lambda: next(ticks))
    assert timed.stopped == "timeout" and len(timed.tries) == 3


def test_ddmin_says_when_the_whole_set_does_not_fail() -> None:
    found = ddmin(list(range(8)), 0, lambda c: (False, 0.0), max_tries=10)
    assert found.stopped == "the whole set does not reproduce" and len(found.tries) == 1


def test_confirmation_stops_once_the_needed_reproductions_cannot_be_reached(tmp_path: Path) -> None:
    gaps = iter([100.0, 900.0, 100.0, 900.0, 900.0])
    runs: list[Path] = []

    def fake_run(scenario: Path, out: Path) -> tuple[dict[int, list[int]], dict[int, float]]:
        runs.append(out)
        return {1: [0, int(next(gaps) * 1e6)]}, {1: 5.0}

    conf = confirm(tmp_path / "scenario.yaml", 1, 5, 500.0, 4, run=fake_run)
    assert (conf.runs, conf.reproduced, conf.gaps_ms) == (3, 1, [100.0, 900.0, 100.0]), "4 of 5: out of reach"
    assert conf.rate == pytest.approx(1 / 3) and len(runs) == 3


def test_confirmations_start_none_after_the_deadline_but_the_first(tmp_path: Path) -> None:
    now = [0.0]

    def slow_run(scenario: Path, out: Path) -> tuple[dict[int, list[int]], dict[int, float]]:
        now[0] += 30.0  # each run takes 30 s of the clock
        return {1: [0, int(900 * 1e6)]}, {1: 5.0}

    late = confirm(tmp_path / "s.yaml", 1, 5, 500.0, 4, deadline=-1.0, run=slow_run, clock=lambda: now[0])
    assert late.runs == 1 and late.reproduced == 1, "past the deadline: the first run only, never none"
    now[0] = 0.0
    timed = confirm(tmp_path / "s.yaml", 1, 5, 500.0, 4, deadline=50.0, run=slow_run, clock=lambda: now[0])
    assert timed.runs == 2 and now[0] <= 50.0 + 30.0, "ends within the deadline plus one run"


def test_a_target_down_at_every_confirmation_exits_2_not_1(tmp_path: Path) -> None:
    from loadgen.errors import TargetError
    from loadgen.shrink.search import ShrinkResult

    def down(scenario: Path, out: Path) -> tuple[dict[int, list[int]], dict[int, float]]:
        raise TargetError("cannot connect to http://127.0.0.1:9/v1: connection refused")

    conf = confirm(tmp_path / "s.yaml", 1, 5, 500.0, 4, run=down)
    assert conf.target_down and conf.errors[0].startswith("cannot connect")
    result = ShrinkResult(tmp_path, None, [], 0.0, None, conf, None, False, {})  # type: ignore[arg-type]
    assert result.exit_code == 2
    conf.errors.pop()  # one run answered: evidence, not reproduced
    assert result.exit_code == 1


def test_the_default_stall_is_the_worst_and_of_its_step_the_victim_sent_last() -> None:
    stalls = pl.DataFrame({"worker": [0] * 4, "seq": [3, 5, 9, 7], "t_end_ns": [10, 50, 50, 50],
                           "chunk_gap_ms": [300.0, 800.0, 799.0, 500.0], "event": [0, 1, 1, 1]})
    requests = pl.DataFrame({"worker": [0] * 4, "seq": [3, 5, 7, 9], "t_intended_ns": [1, 2, 4, 3]})
    assert worst_stall(stalls, requests) == 2  # seq 9: same step, within 1 %, sent after seq 5; seq 7's is smaller


# ---- repro.py's bodies -------------------------------------------------------------------------------------
def sim_bodies(scenario_path: Path) -> Bodies:
    """``build_bodies`` on the embedded simulator, in process: the run's prompt factory and ``Prepared.body``,
    counting through the simulator's own ``/tokenize`` handler (its vLLM dialect) instead of over HTTP."""
    sc = load_scenario(scenario_path)
    cfg = build_config(sc.target.simulator.preset_name, overrides=sc.target.simulator.overrides())

    async def post(path: str, body: dict[str, Any]) -> Any:
        assert path == "/tokenize"
        return tokenize_response(body, cfg)

    async def bodies() -> Bodies:
        factory = PromptFactory(sc, TokenizeEndpointCounter(post, "llama-2-7b", sc.target.api, "vllm"))
        await factory.prepare_classes()
        target = ResolvedTarget("http://sim/v1", "llama-2-7b", {}, REDACTOR, True, tokenize_dialect="vllm")
        return await prepared_bodies(Prepared(sc, build_plan(sc), target, factory))
    return asyncio.run(bodies())


def script_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"repro_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- a replay-made run -------------------------------------------------------------------------------------
def write_run(run_dir: Path, scenario_path: Path, overrides: list[str]) -> dict[str, Any]:
    """A virtual-time run of the scenario on its embedded simulator, written as ``loadgen run`` writes one."""
    vr = virtual_run(scenario_path, overrides)
    sc = load_scenario(scenario_path, overrides)
    run_dir.mkdir(parents=True)
    vr.requests.write_parquet(run_dir / "requests.parquet")
    vr.chunks.write_parquet(run_dir / "chunks.parquet")
    vr.stalls.write_parquet(run_dir / "stalls.parquet")
    spec = sc.target.simulator
    info = {"scenario": sc.model_dump(mode="json"), "planned": vr.requests.height, "seed": sc.seed,
            "target": {"base_url": "embedded", "model": "llama-2-7b", "engine": "vllm",
                       "simulator": {"preset": spec.preset_name, **spec.overrides()}}}
    (run_dir / "run.json").write_text(json.dumps(info))
    return {"stalls": vr.stalls, "requests": vr.requests}


@pytest.fixture(scope="module")
def made_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("shrink") / "run"
    frames = write_run(run_dir, ROOT / "scenarios" / "aggressor_victim.yaml", ["load.duration_s=20"])
    return run_dir, frames


@pytest.fixture(scope="module")
def shrunk(made_run: tuple[Path, dict[str, Any]]) -> Any:
    return shrink(made_run[0], ShrinkOptions(confirmations=0, png=False), bodies_for=sim_bodies)


def test_the_worst_stall_shrinks_to_a_few_requests_that_reproduce_half_its_gap(
        made_run: tuple[Path, dict[str, Any]], shrunk: Any) -> None:
    stalls, victim = made_run[1]["stalls"], shrunk.event.victim
    worst = stalls.filter((pl.col("worker") == victim.worker) & (pl.col("seq") == victim.seq)
                          & (pl.col("t_end_ns") == shrunk.event.t_end_ns)).row(0, named=True)
    assert worst["chunk_gap_ms"] >= 0.99 * stalls["chunk_gap_ms"].max(), "the worst stall (or its step's twin)"
    assert shrunk.event.gap_ms == pytest.approx(worst["chunk_gap_ms"]) and worst["cause"] == "prefill"
    assert len(shrunk.items) <= 5 and shrunk.event.victim in shrunk.items
    assert shrunk.replay_gap_ms >= 0.5 * worst["chunk_gap_ms"]
    assert set(worst["culprits"]) & {i.seq for i in shrunk.items}, "the attributed culprit is kept"
    assert shrunk.reproduced and shrunk.exit_code == 0
    doc = json.loads((shrunk.out / "shrink.json").read_text())
    assert doc["tries"] == len(doc["sets_tried"]) <= 200 and doc["seed_set"] > len(shrunk.items)
    assert [r["seq"] for r in doc["final_set"]] == [i.seq for i in shrunk.items]
    assert (shrunk.out / "figure.vl.json").exists()


def test_the_scenario_replays_exactly_the_final_set(made_run: tuple[Path, dict[str, Any]], shrunk: Any) -> None:
    sc = load_scenario(shrunk.out / "scenario.yaml")
    assert sc.target.embedded and sc.target.simulator.overrides() == {"chunked_prefill": False,
                                                                        "max_num_batched_tokens": 16384}
    rows = read_trace_file(sc)
    requests = made_run[1]["requests"]
    t0 = min(i.t_intended_ns for i in shrunk.items)
    for row, item in zip(rows, shrunk.items):
        r = requests.filter((pl.col("seq") == item.seq)).row(0, named=True)
        assert (row.prompt_tokens, row.output_tokens) == (r["prompt_tokens"], r["output_tokens"])
        assert row.offset_s == pytest.approx((r["t_intended_ns"] - t0) / 1e9, abs=1e-9)


def test_the_script_imports_only_the_standard_library(shrunk: Any) -> None:
    tree = ast.parse((shrunk.out / "repro.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names and names <= set(sys.stdlib_module_names) | {"__future__"}, names
    text = (shrunk.out / "repro.py").read_text()
    assert f"VICTIM = {shrunk.items.index(shrunk.event.victim)}" in text and "sim-llama" not in text


def test_the_scripts_bodies_are_loadgens_with_exact_prompt_lengths_on_the_simulator(shrunk: Any) -> None:
    """repro.py sends loadgen's own bodies byte for byte; by the simulator's tokenizer (its chat template
    included) each prompt has exactly the trace's prompt_tokens, and each body asks its exact output."""
    script = script_module(shrunk.out / "repro.py")
    assert script.PROMPTS == "exact" and shrunk.bodies.exact and "BODIES_ZB64 holds" in script.__doc__
    sent = script.loadgen_bodies()
    assert sent == json.loads(zlib.decompress(base64.b64decode(script.BODIES_ZB64))) == shrunk.bodies.bodies
    assert len(sent) == len(shrunk.items) == len(script.REQUESTS)
    for k, (item, req) in enumerate(zip(shrunk.items, script.REQUESTS)):
        body = script.body_of(k, req, script.MODEL, script.loadgen_bodies())
        assert json.dumps(body).encode() == json.dumps(shrunk.bodies.bodies[k]).encode(), "byte for byte"
        assert len(chat_tokens(body["messages"])) == item.prompt_tokens == req["prompt_tokens"]
        assert body["max_tokens"] == body["min_tokens"] == item.output_tokens and body["ignore_eos"] is True
    assert len({b["messages"][-1]["content"] for b in sent}) == len(sent), "every prompt its own"
    assert script.body_of(0, script.REQUESTS[0], "other", script.loadgen_bodies())["model"] == "other"
    doc = json.loads((shrunk.out / "shrink.json").read_text())["script_prompts"]
    assert doc["mode"] == "exact" and doc["counted_tokens"] == [i.prompt_tokens for i in shrunk.items]


def test_without_bodies_the_script_says_why_and_its_words_are_exact_on_the_simulator(
        shrunk: Any, tmp_path: Path) -> None:
    why = "the target could not be prepared (cannot reach http://127.0.0.1:9/v1/models)"
    path = tmp_path / "repro.py"
    path.write_text(script_text({"target": {"model": "m"}}, load_scenario(shrunk.out / "scenario.yaml"),
                                shrunk.event, shrunk.items, 0.5, "http://127.0.0.1:9/v1", Bodies(why=why)))
    script = script_module(path)
    assert script.PROMPTS == "words" and script.loadgen_bodies() == []
    assert why in " ".join(script.__doc__.split()) and why in prompts_line(Bodies(why=why))
    for k, req in enumerate(script.REQUESTS):
        body = script.body_of(k, req, "m", [])
        assert len(chat_tokens(body["messages"])) == req["prompt_tokens"], "the simulator counts a word a token"


def test_a_target_that_cannot_be_prepared_or_spoken_to_leaves_no_bodies_and_says_why(shrunk: Any,
                                                                                    tmp_path: Path) -> None:
    sc = (shrunk.out / "scenario.yaml").read_text().replace("base_url: embedded", "base_url: http://127.0.0.1:9/v1")
    (tmp_path / "scenario.yaml").write_text(sc)
    (tmp_path / "trace.csv").write_bytes((shrunk.out / "trace.csv").read_bytes())
    got = build_bodies(tmp_path / "scenario.yaml")
    assert not got.built and got.why.startswith("the target could not be prepared (") and "127.0.0.1:9" in got.why
    (tmp_path / "scenario.yaml").write_text(sc.replace("base_url: http://127.0.0.1:9/v1",
                                                       "base_url: http://127.0.0.1:9/v1\n  api: messages"))
    got = build_bodies(tmp_path / "scenario.yaml")
    assert not got.built and "not the target's messages API" in got.why


def test_a_ttft_miss_shrinks_to_the_prefill_it_waited_behind(made_run: tuple[Path, dict[str, Any]],
                                                             tmp_path: Path) -> None:
    """A request the ledger says missed by TTFT: its send-to-first-token time is the event."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("run.json", "requests.parquet", "chunks.parquet", "stalls.parquet"):
        (run / name).write_bytes((made_run[0] / name).read_bytes())
    req = made_run[1]["requests"].filter(pl.col("class_name") == "victim").with_columns(
        ttft_ms=(pl.col("t_first_token_ns") - pl.col("t_sent_ns")) / 1e6)
    slow = req.row(int(req["ttft_ms"].arg_max() or 0), named=True)
    pl.DataFrame({"worker": [slow["worker"]], "seq": [slow["seq"]], "metric": ["ttft_ms"], "cause": ["queueing"],
                  "culprits": [[]]}, schema_overrides={"culprits": pl.List(pl.Int64)}).write_parquet(
        run / "misses.parquet")
    out = shrink(run, ShrinkOptions(request=slow["seq"], confirmations=0, png=False), bodies_for=sim_bodies)
    assert out.event.metric == "ttft_ms" and out.event.gap_ms == pytest.approx(slow["ttft_ms"])
    assert out.event.label == f"request-{slow['seq']}-ttft" and out.reproduced
    assert len(out.items) <= 3 and out.replay_gap_ms >= 0.5 * slow["ttft_ms"]
    assert any(i.prompt_tokens >= 8000 for i in out.items), "the long prompt it waited behind is kept"
    assert 'METRIC = \'ttft_ms\'' in (out.out / "repro.py").read_text()


@pytest.mark.parametrize("args, words", [
    (["--stall", "9999"], "--stall 9999: the run has"),
    (["--request", "999999"], "no request with that seq"),
    (["--stall", "0", "--request", "1"], "not both"),
    (["--max-tries", "0"], "--max-tries 0"),
])
def test_bad_input_is_one_line_and_exit_2(made_run: tuple[Path, dict[str, Any]], args: list[str],
                                          words: str) -> None:
    result = CliRunner().invoke(app, ["shrink", str(made_run[0]), *args])
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())


def test_not_a_run_and_a_run_without_stalls_exit_2(made_run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    assert CliRunner().invoke(app, ["shrink", str(tmp_path / "nothing")]).exit_code == 2
    assert CliRunner().invoke(app, ["shrink", str(tmp_path)]).exit_code == 2
    calm = tmp_path / "calm"
    calm.mkdir()
    for name in ("run.json", "requests.parquet", "chunks.parquet"):
        (calm / name).write_bytes((made_run[0] / name).read_bytes())
    pl.read_parquet(made_run[0] / "stalls.parquet").clear().write_parquet(calm / "stalls.parquet")
    result = CliRunner().invoke(app, ["shrink", str(calm)])
    assert result.exit_code == 2 and "no stalls" in result.output
    result = CliRunner().invoke(app, ["shrink", str(made_run[0]), "--out", str(made_run[0] / "run.json" / "x")])
    assert result.exit_code == 2 and "cannot write there" in result.output


@pytest.mark.slow
def test_the_final_set_reproduces_on_the_embedded_simulator(made_run: tuple[Path, dict[str, Any]],
                                                            shrunk: Any, tmp_path: Path) -> None:
    again = shrink(made_run[0], ShrinkOptions(confirmations=1, out=tmp_path / "confirmed", png=False))
    assert again.items == shrunk.items and again.confirmation is not None
    assert again.confirmation.runs == 1 and again.confirmation.errors == []
    assert again.confirmation.gaps_ms[0] >= 0.5 * shrunk.event.gap_ms and again.exit_code == 0
    assert again.bodies.exact, "built on the real simulator, over HTTP, through the run's own preparation"
    messages = [[b["messages"] for b in got.bodies] for got in (again.bodies, shrunk.bodies)]
    assert messages[0] == messages[1], "the in-process bodies of the fast tests are the real path's"


# ---- the standalone script against the real-time simulator -------------------------------------------------
@pytest.mark.slow
def test_the_script_alone_reproduces_a_prefill_stall_on_the_simulator(tmp_path: Path) -> None:
    from local_target.sim import build_config, start_simulator

    sc = load_scenario(ROOT / "scenarios" / "aggressor_victim.yaml")
    victim = Item(0, 1, "victim", 0, 200, 120)
    culprit = Item(0, 2, "aggressor", 300_000_000, 12000, 4)
    event = Event("stall-0", victim, 0, 0, 1000.0, (2,), "prefill")
    info = {"target": {"model": "llama-2-7b", "simulator": {"preset": "a100-llama-7b"}}}
    path = tmp_path / "repro.py"
    path.write_text(script_text(info, sc, event, [victim, culprit], 0.5, "http://127.0.0.1:9/v1"))
    sim = start_simulator(build_config("a100-llama-7b", overrides=sc.target.simulator.overrides()))
    try:
        done = subprocess.run([sys.executable, str(path), "--url", sim.base_url], capture_output=True, text=True,
                              timeout=30)
    finally:
        sim.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    gap_ms = float(done.stdout.split("victim's worst gap: ")[1].split(" ms")[0])
    assert "TTFT" in done.stdout.splitlines()[0]
    assert gap_ms >= 500, done.stdout  # a 12k-token prefill on this preset: ~1.1 s


# ---- the report's "Smallest reproduction" section ----------------------------------------------------------
def hand_made_shrink(run_dir: Path, label: str, seqs: list[int], spec: bool) -> None:
    out = run_dir / f"shrink-{label}"
    out.mkdir()
    doc = {"event": {"label": label, "victim": {"worker": 0, "seq": seqs[0]}, "gap_ms": 1693.0, "metric": "gap_ms",
                     "culprits": seqs[1:], "cause": "prefill"},
           "threshold_ms": 846.5, "seed_set": 29, "tries": 23, "stopped": "1-minimal", "replay_gap_ms": 1662.0,
           "final_set": [{"worker": 0, "seq": s, "role": "victim" if k == 0 else "culprit", "offset_s": 0.285 * k,
                          "prompt_tokens": 1147 + 14077 * k, "output_tokens": 178} for k, s in enumerate(seqs)],
           "confirmations": {"runs": 5, "asked": 5, "needed": 4, "reproduced": 5, "rate": 1.0,
                             "gaps_ms": [1659.0, 1661.0, 1659.0, 1659.0, 1660.0], "errors": []},
           "reproduced": True}
    (out / "shrink.json").write_text(json.dumps(doc))
    if spec:
        (out / "figure.vl.json").write_text(json.dumps({"mark": "rule", "title": f"figure of {label}"}))


def test_the_report_lists_every_shrink_with_its_set_rate_links_and_figure(
        made_run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    from loadgen.run.reporting import add_shrink_section, rebuild_reports
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("requests.parquet", "chunks.parquet"):
        (run_dir / name).write_bytes((made_run[0] / name).read_bytes())
    info = json.loads((made_run[0] / "run.json").read_text())
    info["target"]["simulator"].update(kv_cache_tokens=65536, time_scale=1.0)  # what the report's header reads
    (run_dir / "run.json").write_text(json.dumps(info))
    hand_made_shrink(run_dir, "stall-89", [301, 302], spec=True)
    hand_made_shrink(run_dir, "request-7", [7], spec=False)
    (run_dir / "shrink-broken").mkdir()
    (run_dir / "shrink-broken" / "shrink.json").write_text("{not json")
    add_shrink_section(run_dir, png=False)  # no summary.json yet: the report is made, then the section added
    assert (run_dir / "summary.json").exists()
    page = (run_dir / "report.html").read_text()
    section = page[page.index("<h2>Smallest reproduction</h2>"):]
    assert "stall-89: reproduced" in section and "request-7: reproduced" in section and "broken" not in section
    for f in ("scenario.yaml", "repro.py", "shrink.json", "figure.vl.json"):
        assert f'href="shrink-stall-89/{f}"' in section
    assert 'href="shrink-request-7/repro.py"' in section and "shrink-request-7/figure.vl.json" not in section
    assert "<td>302</td><td>culprit</td><td>+0.285 s</td><td>15224</td><td>178</td>" in section
    assert "reproduced in 5 of 5 runs (rate 100%)" in section and "1,659, 1,661" in section
    assert "1,662 ms" in section  # the replay's value
    spec_json = section.split('data-chart="shrink-shrink-stall-89-1">')[1].split("</script>")[0]
    assert json.loads(spec_json)["title"] == "figure of stall-89"  # the figure embedded as the page's charts are
    hand_made_shrink(run_dir, "stall-3", [3], spec=False)
    (run_dir / "shrink-stall-3" / "figure.png").write_bytes(b"\x89PNG")
    add_shrink_section(run_dir, png=False)  # a later shrink: the page from the stored summary, every shrink kept
    page = (run_dir / "report.html").read_text()
    assert "stall-89: reproduced" in page and '<img src="shrink-stall-3/figure.png"' in page
    rebuild_reports(run_dir, png=False)  # loadgen report RUN rebuilds the page: the shrinks stay on it
    assert "<h2>Smallest reproduction</h2>" in (run_dir / "report.html").read_text()


# ---- a target that authenticates ---------------------------------------------------------------------------
def test_an_authenticated_url_target_keeps_its_headers_as_references_never_the_secret(
        made_run: tuple[Path, dict[str, Any]], shrunk: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loadgen.plan.scenario import Scenario
    from loadgen.shrink.writers import write_scenario
    info = json.loads((made_run[0] / "run.json").read_text())
    raw = info["scenario"]
    raw["target"].update(base_url="http://127.0.0.1:9/v1", api_key_env="MY_OPENAI_KEY",
                         headers={"X-Api-Key": "***", "X-Team": "infra"})  # as run.json holds them: masked
    raw["target"].pop("simulator", None)
    scenario = Scenario.model_validate(raw)
    url_info = {**info, "target": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}
    path = write_scenario(tmp_path, scenario, url_info, shrunk.event, shrunk.items, made_run[0])
    text = path.read_text()
    assert "${LOADGEN_HEADER_X_API_KEY}" in text and "MY_OPENAI_KEY" in text
    monkeypatch.setenv("LOADGEN_HEADER_X_API_KEY", "sk-secret-123")
    loaded = load_scenario(path)  # what a confirmation (loadgen run) sends
    assert loaded.target.headers == {"X-Api-Key": "sk-secret-123", "X-Team": "infra"}
    assert loaded.target.api_key_env == "MY_OPENAI_KEY"
    script = tmp_path / "repro.py"
    script.write_text(script_text(url_info, scenario, shrunk.event, shrunk.items, 0.5, "http://127.0.0.1:9/v1"))
    assert "sk-secret" not in script.read_text() + text
    repro = script_module(script)
    monkeypatch.setenv("MY_OPENAI_KEY", "sk-key")
    assert repro.request_headers([], "MY_OPENAI_KEY") == {
        "Content-Type": "application/json", "Accept": "text/event-stream", "X-Team": "infra",
        "X-Api-Key": "sk-secret-123", "Authorization": "Bearer sk-key"}
    assert repro.request_headers(["X-Api-Key: other"], "MY_OPENAI_KEY")["X-Api-Key"] == "other"
    monkeypatch.delenv("LOADGEN_HEADER_X_API_KEY")
    assert "set LOADGEN_HEADER_X_API_KEY" in repro.request_headers([], "MY_OPENAI_KEY")
    monkeypatch.delenv("MY_OPENAI_KEY")
    assert "set MY_OPENAI_KEY" in repro.request_headers(["X-Api-Key: v"], "MY_OPENAI_KEY")


def test_confirming_a_masked_header_without_its_variable_is_one_line_and_exit_2(
        made_run: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("requests.parquet", "chunks.parquet", "stalls.parquet"):
        (run_dir / name).write_bytes((made_run[0] / name).read_bytes())
    info = json.loads((made_run[0] / "run.json").read_text())
    info["scenario"]["target"]["headers"] = {"Authorization": "***"}
    (run_dir / "run.json").write_text(json.dumps(info))
    monkeypatch.delenv("LOADGEN_HEADER_AUTHORIZATION", raising=False)
    res = CliRunner().invoke(app, ["shrink", str(run_dir), "--no-png"])
    assert res.exit_code == 2 and "set LOADGEN_HEADER_AUTHORIZATION (target.headers.Authorization)" in res.output


def test_a_ttft_miss_blamed_on_loadgen_itself_is_refused_with_its_reason(
        made_run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("requests.parquet", "chunks.parquet", "stalls.parquet", "run.json"):
        (run_dir / name).write_bytes((made_run[0] / name).read_bytes())
    seq = int(made_run[1]["requests"]["seq"][3])
    pl.DataFrame({"worker": [0], "seq": [seq], "metric": ["ttft_ms"], "cause": ["client_lag"],
                  "culprits": [[]], "evidence": ["loadgen sent it 404 ms late"]},
                 schema_overrides={"culprits": pl.List(pl.Int64)}).write_parquet(run_dir / "misses.parquet")
    res = CliRunner().invoke(app, ["shrink", str(run_dir), "--request", str(seq), "--no-png"])
    assert res.exit_code == 2 and "loadgen's own lag" in res.output and "404 ms late" in res.output


def test_a_slow_client_run_shrinks_to_a_scenario_that_sends_on_time(
        made_run: tuple[Path, dict[str, Any]], shrunk: Any, tmp_path: Path) -> None:
    from loadgen.plan.scenario import Scenario
    from loadgen.shrink.writers import write_scenario
    info = json.loads((made_run[0] / "run.json").read_text())
    raw = info["scenario"]
    faults = raw["target"].setdefault("simulator", {}).setdefault("faults", {})
    faults.update(client_block_ms=400, client_block_every_s=2, error_rate=0.01)
    path = write_scenario(tmp_path, Scenario.model_validate(raw), info, shrunk.event, shrunk.items, made_run[0])
    loaded = load_scenario(path)
    kept = loaded.target.simulator.faults
    assert kept is not None and kept.error_rate == 0.01  # the server's faults stay
    assert not kept.client_block_ms and not kept.client_block_every_s  # loadgen's own blocks are not the event
