"""The signs ``loadgen check`` looks for, read from a run's own records: a server (or a gateway in front of it)
that coalesces tokens or buffers the stream limits what the run's ITL can mean, whatever the verdict says.

The rules are ``check_findings``' own (``coalescing``, ``buffering``, ``usage``: a usage claim no answer can
hold, which the records replaced by loadgen's own count (``usage_rejected``, core/usage_claims.py), completion_tokens
over ``max_tokens`` or under the chunks that carried tokens), applied to the measured requests that
ended cleanly — at most ``SAMPLE_REQUESTS`` of them, spread evenly over the run (a server's framing is the same
for every request; an hour-long run's millions of chunks need not all be walked). Only a ``finding`` is kept:
a run where nothing limits the measurement has none. Pure: records in, findings out.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from loadgen.analysis.check_findings import FINDING, Probe, buffering, coalescing, usage

SAMPLE_REQUESTS = 200
KEY = ["worker", "seq"]


def run_findings(requests: pl.DataFrame, chunks: pl.DataFrame | pl.LazyFrame) -> list[dict[str, Any]]:
    """The findings (``Finding.to_json()``: name, status, summary, evidence) the run's records show."""
    answers = _answers(requests, chunks)
    if not answers:
        return []
    times = [a.chunk_times() for a in answers]
    return [f.to_json() for f in (coalescing(times), buffering(times), usage(answers)) if f.status == FINDING]


def _answers(requests: pl.DataFrame, chunks: pl.DataFrame | pl.LazyFrame) -> list[Probe]:
    """Each sampled request as check's probe would have read it: its chunk stamps, the output tokens the server
    reported (None without usage), what it asked for and why it stopped."""
    ok = requests.filter(~pl.col("warmup") & pl.col("error_kind").is_null() & (pl.col("chunks") > 0)).sort(KEY)
    if ok.height == 0:
        return []
    sample = ok.gather_every(max(1, ok.height // SAMPLE_REQUESTS)).head(SAMPLE_REQUESTS)
    if "usage_rejected" in ok.columns:  # a claim no answer can hold (core/usage_claims.py): in the sample, if any
        rejected = ok.filter(pl.col("usage_rejected").is_not_null()).head(SAMPLE_REQUESTS // 2)
        sample = pl.concat([rejected, sample]).unique(KEY, keep="first").sort(KEY).head(SAMPLE_REQUESTS)
    times = (chunks.lazy().join(sample.select(KEY).lazy(), on=KEY, how="semi").collect().sort([*KEY, "t_ns"])
             .group_by(KEY, maintain_order=True).agg(pl.col("t_ns")))
    rows = sample.join(times, on=KEY, how="inner").select(
        "t_ns", "t_sent_ns", "t_done_ns", "output_tokens_asked",
        # a request that reasoned ran under max_tokens = its answer plus a thinking budget the records do not
        # hold, so where it stopped at that cap is not judged against the answer asked for
        pl.when(pl.col("reasoning_tokens").fill_null(0) == 0).then(pl.col("finish_reason")).alias("finish_reason"),
        pl.when(pl.col("output_tokens_source") == "server").then(pl.col("output_tokens")).alias("tokens"),
        pl.col("usage_rejected") if "usage_rejected" in sample.columns else pl.lit(None).alias("usage_rejected"))
    return [Probe(200, None, r["t_sent_ns"], r["t_done_ns"], None, True, tuple(r["t_ns"]), r["output_tokens_asked"],
                  r["tokens"], None, finish_reason=r["finish_reason"], usage_rejected=r["usage_rejected"])
            for r in rows.iter_rows(named=True)]
