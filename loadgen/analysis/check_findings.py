"""``loadgen check``'s judgement of streamed answers: pure functions from what the probes read to one ``Finding``
per line (docs/check.md has each line's threshold and what a finding means for measurement).

No I/O: ``run/check.py`` sends the probes and hands their answers here as ``Probe``s. The signs a run's own
records can show too take ``ChunkTimes`` (one answer's content-chunk read stamps, its output tokens, its send
and end stamps: ``RequestRecord`` + its ``ChunkRecord``s), so that a run can apply the same rule to every
request it measured:

    coalescing(answers: Sequence[ChunkTimes]) -> Finding
    buffering(answers: Sequence[ChunkTimes]) -> Finding

A ``Finding``'s ``status``: ``ok``; ``info`` (worth knowing, measurement unaffected); ``finding`` (it limits what
can be measured here); ``fail`` (it cannot be measured).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

OK, INFO, FINDING, FAIL = "ok", "info", "finding", "fail"
RANK = {OK: 0, INFO: 1, FINDING: 2, FAIL: 3}

COALESCED_TOKENS_PER_CHUNK = 1.2  # more tokens per content chunk than this: the server coalesces
BUFFERED_CHUNKS_PER_READ = 3.0  # more content chunks per socket read than this: the stream comes in bursts
BUFFERED_SPREAD_SHARE = 0.02  # or all content arrived within this share of the answer's time ...
BUFFERED_READ_GAP_MS = 1.0  # ... its reads closer than this (no server decodes one stream that fast)
BUFFER_MIN_CHUNKS = 4  # fewer chunks say nothing about bursts
FIRST_CHUNK_LEAD_MS = 5.0  # a role-only first chunk this much (and ...
FIRST_CHUNK_LEAD_SHARE = 0.1  # ... this share of TTFT) before the first token is early
RESPONSE_CACHE_RATIO = 0.3  # a repeated prompt's e2e (and decode) below this share of a fresh one's: cached
PREFIX_CACHE_RATIO = 0.6  # a repeated prompt's TTFT below this share of a fresh one's ...
PREFIX_CACHE_MIN_MS = 2.0  # ... and this much sooner: a prefix cache
USAGE_TOLERANCE_TOKENS = 1  # usage may differ from the truth by this many tokens ...
USAGE_TOLERANCE_SHARE = 0.02  # ... or this share of it


@dataclass(frozen=True)
class Finding:
    name: str  # stable id: streaming, first_chunk, coalescing, ...
    status: str  # ok | info | finding | fail
    summary: str  # one line
    evidence: dict[str, Any] = field(default_factory=dict)  # the numbers it rests on

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ChunkTimes:
    """One streamed answer's content chunks as read: what a run's records hold too."""

    times_ns: tuple[int, ...]  # each content chunk's read stamp (chunks of one read share it)
    tokens: int | None  # the answer's output tokens (None: unknown)
    t_sent_ns: int
    t_done_ns: int

    @property
    def chunks(self) -> int:
        return len(self.times_ns)

    @property
    def reads(self) -> int:
        return len(set(self.times_ns))

    def gaps_ms(self) -> list[float]:
        """The gaps between consecutive content chunks."""
        return [(b - a) / 1e6 for a, b in zip(self.times_ns, self.times_ns[1:])]

    def read_gaps_ms(self) -> list[float]:
        """The gaps between consecutive reads that brought content."""
        reads = sorted(set(self.times_ns))
        return [(b - a) / 1e6 for a, b in zip(reads, reads[1:])]


@dataclass(frozen=True)
class Probe:
    """One probe's streamed answer as ``loadgen check`` read it (stamps on the monotonic clock, in ns)."""

    status: int
    error: str | None  # why it could not be measured (None: it ended cleanly)
    t_sent_ns: int
    t_done_ns: int
    t_first_event_ns: int | None  # the first SSE event of any kind
    first_event_text: bool  # that event carried generated text
    content_ns: tuple[int, ...]  # each chunk with generated text
    max_tokens: int  # asked
    completion_tokens: int | None  # usage, as reported
    prompt_tokens: int | None  # usage, as reported
    cached_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    prompt_counted: int | None = None  # the prompt's length by an exact tokenizer (None: none at hand)
    usage_rejected: str | None = None  # why a usage count was not taken (core/usage_claims.py)
    after_done: int = 0  # events the server sent after [DONE] (not counted)

    @property
    def generated(self) -> int | None:
        """The answer's output tokens: usage's where it is within max_tokens (a context limit or a server's own
        cap may stop an answer sooner, finish_reason length too: usage says how many then); else max_tokens when
        the answer stopped with finish_reason length (no usage, or usage over the cap); else unknown (None)."""
        n = self.completion_tokens
        if n is not None and n <= self.max_tokens:
            return n
        return self.max_tokens if self.finish_reason == "length" else None

    def chunk_times(self) -> ChunkTimes:
        return ChunkTimes(self.content_ns, self.generated, self.t_sent_ns, self.t_done_ns)

    @property
    def ttft_ms(self) -> float | None:
        return (self.content_ns[0] - self.t_sent_ns) / 1e6 if self.content_ns else None

    @property
    def e2e_ms(self) -> float:
        return (self.t_done_ns - self.t_sent_ns) / 1e6

    @property
    def decode_ms(self) -> float:
        return (self.content_ns[-1] - self.content_ns[0]) / 1e6 if self.content_ns else 0.0


def _p50(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _good(probes: Sequence[Probe]) -> list[Probe]:
    return [p for p in probes if p.error is None and p.content_ns]


def streaming(probes: Sequence[Probe]) -> Finding:
    """Did the answers stream, token by token, to a clean end?"""
    good, failed = _good(probes), [p for p in probes if p.error is not None or not p.content_ns]
    evidence = {"answers": len(probes), "failed": len(failed), "statuses": sorted({p.status for p in probes}),
                "chunks_p50": _p50([len(p.content_ns) for p in good]),
                "ttft_ms_p50": _r(_p50([p.ttft_ms or 0.0 for p in good])),
                "e2e_ms_p50": _r(_p50([p.e2e_ms for p in good]))}
    if not good:
        why = next((p.error for p in failed if p.error), "no generated text")
        return Finding("streaming", FAIL, f"no probe's answer could be measured: {why}", evidence)
    if failed:
        why = next((p.error for p in failed if p.error), "no generated text")
        return Finding("streaming", FINDING, f"{len(failed)} of {len(probes)} answers could not be measured: {why}",
                       evidence)
    if all(len(p.content_ns) == 1 and p.max_tokens > 1 for p in good):
        return Finding("streaming", FINDING, "each answer arrives as one chunk: nothing streams (TTFT is the whole "
                       "answer's time, ITL is not measurable)", evidence)
    return Finding("streaming", OK, f"answers stream ({evidence['chunks_p50']:g} content chunks each) and end "
                   "cleanly", evidence)


def first_chunk(probes: Sequence[Probe], api: str = "chat") -> Finding:
    """Does the first chunk carry a generated token, and if not, how long before the first token does it come?"""
    good = [p for p in _good(probes) if p.t_first_event_ns is not None]
    if not good:
        return Finding("first_chunk", INFO, "no answer to judge", {})
    lead_ms = _p50([(p.content_ns[0] - p.t_first_event_ns) / 1e6 for p in good])  # type: ignore[operator]
    ttft_ms = _p50([p.ttft_ms or 0.0 for p in good])
    carries = all(p.first_event_text for p in good)
    evidence = {"first_chunk_has_token": carries, "first_chunk_lead_ms_p50": _r(lead_ms, 2),
                "ttft_ms_p50": _r(ttft_ms), "answers": len(good)}
    if carries:
        return Finding("first_chunk", OK, "the first chunk carries the first token; TTFT is taken at it", evidence)
    if lead_ms <= max(FIRST_CHUNK_LEAD_MS, FIRST_CHUNK_LEAD_SHARE * ttft_ms):
        return Finding("first_chunk", OK, f"the first chunk holds no token but comes with the first one ({lead_ms:.1f} "
                       "ms before it); TTFT is taken at the first token", evidence)
    if api not in ("chat", "completions"):
        return Finding("first_chunk", INFO, f"the API's opening events come {lead_ms:.0f} ms before the first token "
                       "(by design); TTFT is taken at the first token", evidence)
    return Finding("first_chunk", FINDING, f"the first chunk is role-only or empty and comes {lead_ms:.0f} ms before "
                   f"the first token: TTFT here depends on what is timed — loadgen times the first token; "
                   f"time-to-first-byte, and tools that time the first chunk, read {lead_ms:.0f} ms less", evidence)


def coalescing(answers: Sequence[ChunkTimes]) -> Finding:
    """Several tokens per content chunk (the answers' tokens against their chunks): ITL below the chunk gap is
    then not measurable."""
    counted = [a for a in answers if a.tokens and a.chunks]
    if not counted:
        return Finding("coalescing", INFO, "no answer with a known token count: not judged", {})
    tokens, chunks = sum(a.tokens or 0 for a in counted), sum(a.chunks for a in counted)
    per_chunk = tokens / chunks
    gap_ms = _p50([g for a in counted for g in a.gaps_ms()])
    evidence = {"tokens": tokens, "chunks": chunks, "tokens_per_chunk": round(per_chunk, 2),
                "chunk_gap_ms_p50": _r(gap_ms, 2), "answers": len(counted)}
    if per_chunk > COALESCED_TOKENS_PER_CHUNK:
        return Finding("coalescing", FINDING, f"the server coalesces tokens ({per_chunk:.1f} per chunk): ITL below "
                       f"{max(gap_ms, 0.1):.0f} ms is not measurable here (each chunk's tokens share one time)",
                       evidence)
    return Finding("coalescing", OK, f"one token per chunk ({tokens} tokens in {chunks} chunks)", evidence)


def buffering(answers: Sequence[ChunkTimes]) -> Finding:
    """The chunks arrive in bursts (many per socket read), or all within a sliver of the answer's time at its
    end: something buffers the stream, and the gaps inside a burst are not measurable."""
    judged = [a for a in answers if a.chunks >= BUFFER_MIN_CHUNKS]
    if not judged:
        return Finding("buffering", INFO, f"no answer of {BUFFER_MIN_CHUNKS} or more chunks: not judged", {})
    chunks, reads = sum(a.chunks for a in judged), sum(a.reads for a in judged)
    spread_ms = _p50([(a.times_ns[-1] - a.times_ns[0]) / 1e6 for a in judged])
    e2e_ms = _p50([(a.t_done_ns - a.t_sent_ns) / 1e6 for a in judged])
    share = spread_ms / e2e_ms if e2e_ms > 0 else 1.0
    gaps = [g for a in judged for g in a.read_gaps_ms()]
    evidence = {"chunks": chunks, "reads": reads, "chunks_per_read": round(chunks / reads, 2),
                "content_spread_ms_p50": _r(spread_ms, 2), "e2e_ms_p50": _r(e2e_ms),
                "read_gap_ms_p50": _r(_p50(gaps), 2), "answers": len(judged)}
    # a long prefill or a queue makes the content a small share of the answer's time too: squeezed content is
    # also far faster than any decode
    squeezed = share < BUFFERED_SPREAD_SHARE and _p50(gaps) < BUFFERED_READ_GAP_MS
    if chunks / reads > BUFFERED_CHUNKS_PER_READ or squeezed:
        limit = f"ITL below {max(_p50(gaps), 0.1):.0f} ms" if gaps else "ITL"
        return Finding("buffering", FINDING, f"the stream is buffered: {chunks / reads:.1f} chunks per read, the "
                       f"content within {spread_ms:.1f} ms of a {e2e_ms:.0f} ms answer: {limit} is not measurable "
                       "here", evidence)
    return Finding("buffering", OK, f"chunks arrive as they are sent ({chunks / reads:.1f} per read, over "
                   f"{spread_ms:.0f} ms of a {e2e_ms:.0f} ms answer)", evidence)


def caching(repeated: Sequence[Probe], salted: Sequence[Probe]) -> Finding:
    """The same prompt sent again against fresh (salted) prompts of the same length: a response cache collapses
    the whole answer's time; a prefix cache only shortens the time to the first token (info)."""
    again, fresh = _good(repeated[1:]), _good(salted)  # the first of the repeated fills any cache
    if not again or not fresh:
        return Finding("caching", INFO, "too few answers to compare repeated and fresh prompts", {})
    e2e_again, e2e_fresh = _p50([p.e2e_ms for p in again]), _p50([p.e2e_ms for p in fresh])
    dec_again, dec_fresh = _p50([p.decode_ms for p in again]), _p50([p.decode_ms for p in fresh])
    ttft_again, ttft_fresh = _p50([p.ttft_ms or 0.0 for p in again]), _p50([p.ttft_ms or 0.0 for p in fresh])
    cached = max((p.cached_tokens or 0 for p in again), default=0)
    same = len({p.text for p in _good(repeated)}) == 1
    evidence = {"repeated_e2e_ms_p50": _r(e2e_again), "fresh_e2e_ms_p50": _r(e2e_fresh),
                "repeated_decode_ms_p50": _r(dec_again), "fresh_decode_ms_p50": _r(dec_fresh),
                "repeated_ttft_ms_p50": _r(ttft_again), "fresh_ttft_ms_p50": _r(ttft_fresh),
                "repeated_same_text": same, "cached_tokens": cached, "repeated": len(again), "fresh": len(fresh)}
    decode_collapsed = dec_fresh <= 0 or dec_again < RESPONSE_CACHE_RATIO * dec_fresh
    if e2e_again < RESPONSE_CACHE_RATIO * e2e_fresh and decode_collapsed:
        text = " with the same text" if same else ""
        return Finding("caching", FINDING, f"responses are cached: a repeated prompt is answered in {e2e_again:.0f} ms"
                       f"{text}, a fresh one in {e2e_fresh:.0f} ms: repeated prompts (datasets, retries) measure the "
                       "cache, not the model", evidence)
    if cached or (ttft_again < PREFIX_CACHE_RATIO * ttft_fresh and ttft_fresh - ttft_again > PREFIX_CACHE_MIN_MS):
        return Finding("caching", INFO, f"a prefix cache: a repeated prompt's first token comes after {ttft_again:.0f}"
                       f" ms, a fresh one's after {ttft_fresh:.0f} ms (cached_tokens {cached}); decode is unchanged, "
                       "so shared prefixes are measured with the cache", evidence)
    return Finding("caching", OK, f"no response or prefix cache seen: repeated prompts take as long as fresh ones "
                   f"({e2e_again:.0f} vs {e2e_fresh:.0f} ms)", evidence)


def _off(reported: int, truth: int) -> bool:
    return abs(reported - truth) > max(USAGE_TOLERANCE_TOKENS, USAGE_TOLERANCE_SHARE * truth)


def usage(probes: Sequence[Probe]) -> Finding:
    """Is usage reported in the stream, and does completion_tokens tell the truth (possible at all: the
    tracker's ``usage_claims`` rule; never over max_tokens, nor fewer than the chunks that carried tokens)?"""
    good = _good(probes)
    if not good:
        return Finding("usage", INFO, "no answer to judge", {})
    reported = [p.completion_tokens for p in good]
    evidence: dict[str, Any] = {"completion_tokens": reported, "max_tokens": [p.max_tokens for p in good],
                                "finish_reasons": sorted({str(p.finish_reason) for p in good}),
                                "chunks": [len(p.content_ns) for p in good]}
    rejected = [p.usage_rejected for p in good if p.usage_rejected]
    if rejected:
        evidence["usage_rejected"] = rejected[:3]
    if any(p.completion_tokens is None and not p.usage_rejected for p in good):
        return Finding("usage", FINDING, "no usage in the stream (stream_options.include_usage not honoured): output "
                       "tokens are estimated from the text, not counted", evidence)
    for p in good:
        if p.completion_tokens is None:  # a run's record keeps no claim it rejected: said below
            continue
        n = p.completion_tokens
        # a server stops at max_tokens, and may stop sooner (a context limit, its own cap: finish_reason length
        # too); a finish_reason of None: the cap is not known (a run's reasoning request: answer plus budget)
        if p.finish_reason is not None and n > p.max_tokens and _off(n, p.max_tokens):
            return Finding("usage", FINDING, f"usage misreports completion_tokens: {n} reported, {p.max_tokens} "
                           f"generated at most (max_tokens {p.max_tokens}): output tokens and tokens/s taken from "
                           "usage are wrong here", evidence)
        if n < len(p.content_ns):
            return Finding("usage", FINDING, f"usage misreports completion_tokens: {n} reported for "
                           f"{len(p.content_ns)} chunks that each carried a token", evidence)
    if rejected:
        return Finding("usage", FINDING, f"usage claims counts no answer can hold in {len(rejected)} of {len(good)} "
                       f"answers: loadgen's own counts are kept there (first: {rejected[0]})", evidence)
    if all(p.finish_reason == "length" and p.completion_tokens == p.max_tokens for p in good):
        return Finding("usage", OK, f"usage reported; completion_tokens = max_tokens ({good[0].max_tokens}) in every "
                       "answer", evidence)
    return Finding("usage", OK, "usage reported and not below the chunks counted (answers stopped before max_tokens: "
                   "not checked against it)", evidence)


def after_done(probes: Sequence[Probe]) -> Finding:
    """Does the server send events after ``[DONE]`` (OpenAI's end of the stream)? loadgen stops counting there."""
    late = [p.after_done for p in probes if p.after_done]
    evidence = {"answers": len(probes), "answers_with_data_after_done": len(late), "events_after_done": sum(late)}
    if late:
        return Finding("after_done", INFO, f"data after [DONE]: {len(late)} of {len(probes)} answers went on with "
                       f"{sum(late)} events after it (not counted: the stream ends at [DONE]; tools that read on count "
                       "them)", evidence)
    return Finding("after_done", OK, "nothing after [DONE]", evidence)


def tokenizer(probes: Sequence[Probe], source: str | None) -> Finding:
    """Does usage.prompt_tokens agree with the tokenizer loadgen sizes prompts with (``source``: its name, None
    when it has no exact one)?"""
    pairs = [(p.prompt_tokens, p.prompt_counted) for p in _good(probes)
             if p.prompt_tokens is not None and p.prompt_counted is not None]
    if source is None:
        return Finding("tokenizer", INFO, "no exact tokenizer (no tokenize endpoint, no target.tokenizer): prompt "
                       "lengths are calibrated on usage, not checked", {})
    if not pairs:
        return Finding("tokenizer", INFO, "no usage.prompt_tokens to check against the tokenizer", {"source": source})
    evidence = {"source": source, "prompt_tokens_reported": [a for a, _ in pairs],
                "prompt_tokens_counted": [b for _, b in pairs]}
    for reported, counted in pairs:
        off = int(reported or 0) - int(counted or 0)
        if _off(int(reported or 0), int(counted or 0)):
            return Finding("tokenizer", FINDING, f"usage.prompt_tokens disagrees with {source}: {reported} reported, "
                           f"{counted} counted ({off:+d}): prompt lengths are not what was asked, or usage "
                           "misreports them", evidence)
    return Finding("tokenizer", OK, f"usage.prompt_tokens agrees with {source} ({pairs[0][1]} tokens)", evidence)
