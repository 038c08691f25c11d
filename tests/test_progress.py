"""The run's progress and start banner (issue 40), pure: the ETA from a plan's last send, the live figures over a
fake engine's counts, the plain line a log gets where stderr is no terminal, and the banner at 80 columns wrapped
without cutting anything."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console

from loadgen import __version__
from loadgen.core.records import RequestRecord
from loadgen.drivers.engine_config import EngineStats
from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import Plan
from loadgen.report.banner import banner_lines
from loadgen.run.progress import PLAIN_PERIOD_S, RunProgress, clock, sending_end_s

S = 1_000_000_000


def scenario(load: dict[str, object], slo: dict[str, object] | None = None) -> Scenario:
    return Scenario.model_validate({
        "name": "quick", "target": {"base_url": "http://user:secret@gpu-box.example:8000/v1"},
        "load": load, "workload": {"classes": [{"name": "c", "prompt_tokens": {"dist": "uniform", "min": 461,
                                                                             "max": 563},
                                                "output_tokens": {"dist": "fixed", "value": 128}}]},
        "slo": {"ttft_ms": {"p99": 2000}, "error_rate": {"max": 0.01}} if slo is None else slo})


def record(seq: int, t_ns: int, ttft_ms: float, tokens: int = 100) -> RequestRecord:
    return RequestRecord(seq=seq, class_name="c", warmup=False, t_intended_ns=t_ns,
                         t_sent_ns=t_ns, t_first_token_ns=t_ns + int(ttft_ms * 1e6), t_last_token_ns=t_ns + S,
                         t_done_ns=t_ns + S, prompt_tokens_asked=512, prompt_tokens=500, prompt_tokens_source="server",
                         output_tokens_asked=tokens, output_tokens=tokens, output_tokens_source="server", chunks=tokens)


def test_the_eta_counts_down_to_the_last_send_of_an_open_or_closed_plan() -> None:
    open_plan = Plan(scenario({"arrival": "constant", "rate_per_s": 2, "duration_s": 20}))
    assert open_plan.offsets_s is not None
    assert 19 <= (sending_end_s(open_plan) or 0) < 20
    closed = Plan(scenario({"arrival": "concurrency", "concurrency": 4, "duration_s": 60, "warmup_s": 5}))
    assert sending_end_s(closed) == 65
    assert [clock(x) for x in (0, 9.6, 65, 3725)] == ["0:00", "0:10", "1:05", "1:02:05"]


def test_a_log_gets_a_plain_line_with_the_eta_and_live_figures_every_few_seconds() -> None:
    plan = Plan(scenario({"arrival": "concurrency", "concurrency": 4, "duration_s": 60, "warmup_s": 5}))
    out = io.StringIO()
    st = EngineStats(t0_ns=100 * S)
    with RunProgress(plan, True, Console(file=out, width=80)) as progress:  # a StringIO: no terminal
        assert progress.plain
        for second in range(0, 11):
            now = (100 + second) * S
            for i in range(4):  # 4 requests a second, 50 output tokens each, TTFT 20 ms then 80 ms
                st.count(record(second * 4 + i, now - S, 20.0 if second < 6 else 80.0, tokens=50))
            progress.update(st, now)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + 10 // int(PLAIN_PERIOD_S)  # at the start, then every PLAIN_PERIOD_S
    assert lines[0].startswith("running 0:00 · ETA 1:05 ·")
    last = lines[-1]
    assert last.startswith("running 0:10 · ETA 0:55 ·") and "failed 0 · in flight 0" in last
    assert "· 4.0 req/s · out 200 tok/s · TTFT p50 80 ms" in last, last  # the last 5 s: 80 ms, not the 20 before
    assert st.prompt_tokens == 44 * 500


def test_the_live_ttft_median_reads_only_the_last_seconds() -> None:
    plan = Plan(scenario({"arrival": "constant", "rate_per_s": 1, "duration_s": 30}))
    st = EngineStats(t0_ns=S)
    st.recent_ttft_ms.extend([(2 * S, 900.0)] * 10 + [(20 * S, 30.0)] * 3)  # old slow ones, then three fast
    progress = RunProgress(plan, True, Console(file=io.StringIO()))
    line = progress.line(st, 21 * S)
    assert "TTFT p50 30 ms" in line and "ETA 0:" in line


def test_no_progress_prints_nothing() -> None:
    plan = Plan(scenario({"arrival": "constant", "rate_per_s": 1, "duration_s": 30}))
    out = io.StringIO()
    with RunProgress(plan, False, Console(file=out)) as progress:
        progress.update(EngineStats(t0_ns=S), 10 * S)
    assert out.getvalue() == ""


def test_the_banner_at_80_columns_wraps_on_its_separators_and_cuts_nothing() -> None:
    sc = scenario({"arrival": "poisson", "rate_per_s": 4, "duration_s": 20})
    target = SimpleNamespace(base_url="http://user:secret@gpu-box.example:8000/v1", model="meta-llama/Llama-3.1-8B-"
                             "Instruct", engine="vllm")
    out = "reports/20261127-051500-quick-start-against-the-gpu-box"
    lines = banner_lines(sc, target, out, 80)
    text = " · ".join(lines)
    assert all(len(line) <= 80 for line in lines) and len(lines) >= 2 and "…" not in text
    assert lines[0].startswith(f"loadgen {__version__} → http://user:***@gpu-box.example:8000/v1") and "secret" not in text
    for part in ("model meta-llama/Llama-3.1-8B-Instruct (vllm)", "poisson 4 req/s", "461-563/128 tok",
                 "20 s (+0 s warm-up)", "2 SLOs", out):
        assert part in text, (part, lines)
    wide = banner_lines(sc, target, out, 400)
    assert len(wide) == 1 and wide[0] == text.replace("\n", "")


def test_the_banner_says_when_no_objective_but_no_failure_is_declared() -> None:
    sc = scenario({"arrival": "concurrency", "concurrency": 8, "duration_s": 60, "warmup_s": 10}, slo={})
    target = SimpleNamespace(base_url="http://h:8000/v1", model="m", engine=None)
    text = " ".join(banner_lines(sc, target, None, 120))
    assert "8 users (closed loop)" in text and "60 s (+10 s warm-up)" in text
    assert "SLO: no failed request" in text and "reports" not in text


def test_a_terminal_at_80_columns_gets_the_bar_and_every_figure_wrapped_not_cut() -> None:
    plan = Plan(scenario({"arrival": "constant", "rate_per_s": 2, "duration_s": 20}))
    out = io.StringIO()
    st = EngineStats(t0_ns=100 * S)
    with RunProgress(plan, True, Console(file=out, width=80, force_terminal=True, color_system=None)) as progress:
        assert not progress.plain
        for second in range(3):
            st.count(record(second, (100 + second) * S, 20.0))
            progress.update(st, (100 + second) * S)
    final = out.getvalue().split("\r")[-1]
    assert "━" in final and "ETA 0:18" in final and "in flight 0" in final and "…" not in final
    assert all(len(line) <= 80 for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", final).splitlines())


def test_the_banner_counts_objectives_not_settings() -> None:
    slo = {"ttft_ms": {"p50": 300, "p99": 2000}, "error_rate": {"max": 0},
           "stalls": {"spike_factor": 5, "min_gap_ms": 50, "max_prefill_induced_per_1k_tokens": 1},
           "goodput": {"ttft_ms": 2000, "min_ratio": 0.9}}
    sc = scenario({"arrival": "constant", "rate_per_s": 1, "duration_s": 10}, slo=slo)
    target = SimpleNamespace(base_url="http://h:8000/v1", model="m", engine=None)
    assert "· 5 SLOs" in " ".join(banner_lines(sc, target, None, 200))
