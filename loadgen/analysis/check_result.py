"""``loadgen check``'s judgement of the endpoints, the HTTP connection and the largest prompt, the verdict, and
the typed ``CheckResult`` (the console lines and ``--json`` are views of it). Pure: ``run/check.py`` asks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from loadgen.analysis.check_findings import FAIL, FINDING, INFO, OK, RANK, Finding

EXIT_CLEAN, EXIT_FINDINGS, EXIT_UNUSABLE = 0, 1, 2


def tokenize_endpoint(dialect: str | None, path: str | None, tokenizer_file: str | None) -> Finding:
    """Where exact prompt lengths come from."""
    evidence = {"dialect": dialect, "path": path, "tokenizer_file": tokenizer_file}
    if dialect is not None:
        return Finding("tokenize_endpoint", OK, f"{path} answers ({dialect} dialect): prompt lengths are exact",
                       evidence)
    if tokenizer_file is not None:
        return Finding("tokenize_endpoint", INFO, f"no tokenize endpoint: prompt lengths from {tokenizer_file}",
                       evidence)
    return Finding("tokenize_endpoint", INFO, "no tokenize endpoint and no target.tokenizer: prompt lengths are "
                   "approximate (calibrated on usage; achieved lengths are recorded from usage)", evidence)


def metrics_endpoint(status: int | None, engine: str | None, series: int, error: str | None = None) -> Finding:
    """Whether /metrics serves series loadgen reads (queue, KV cache, tokens) next to a run."""
    evidence = {"status": status, "engine": engine, "series_read": series, "error": error}
    if status != 200:
        why = error or f"HTTP {status}"
        return Finding("metrics_endpoint", INFO, f"no /metrics ({why}): a run has no server-side series", evidence)
    if engine is None or not series:
        return Finding("metrics_endpoint", INFO, "/metrics answers with no series loadgen knows: a run has no "
                       "server-side series", evidence)
    return Finding("metrics_endpoint", OK, f"/metrics serves {engine}'s series ({series} read)", evidence)


def http_version(version: str, scheme: str) -> Finding:
    evidence = {"http_version": version, "scheme": scheme}
    if version == "1.1":
        return Finding("http", OK, f"HTTP/1.1 over {scheme}", evidence)
    if not version:
        return Finding("http", INFO, "no response to read the HTTP version from", evidence)
    return Finding("http", INFO, f"HTTP/{version} over {scheme}: no keep-alive by default; each request opens a "
                   "connection", evidence)


def compression(codings: Sequence[str]) -> Finding:
    """loadgen asks for identity; a server that compresses anyway is decoded (its reads still stamped on
    arrival; a compressor that holds bytes back shows as buffering)."""
    used = sorted({c for c in codings if c and c != "identity"})
    evidence = {"content_encoding": used or None}
    if used:
        return Finding("compression", INFO, f"the stream is compressed ({', '.join(used)}) although identity was "
                       "asked: loadgen decodes it", evidence)
    return Finding("compression", OK, "no compression (identity, as asked)", evidence)


def keep_alive(answers: int, closing: int, connections: int) -> Finding:
    """Whether one connection serves answer after answer: of ``answers`` streamed probes sent one after another,
    ``closing`` ended their connection (``Connection: close``, or HTTP/1.0 without keep-alive); ``connections``
    were opened meanwhile (the prompts' counting included)."""
    evidence = {"answers": answers, "closing_answers": closing, "connections_opened": connections}
    if closing or (answers > 1 and connections >= answers):
        return Finding("keep_alive", INFO, f"the server closes the connection after {closing} of {answers} answers: a "
                       "run's requests each open one (the connect is not in TTFT; at high rates, ports in TIME_WAIT)",
                       evidence)
    return Finding("keep_alive", OK, f"connections are kept alive ({answers} answers, {connections} new "
                   "connection(s))", evidence)


@dataclass(frozen=True)
class PromptTry:
    """One request of the largest-prompt probe (max_tokens 1)."""

    tokens: int  # the prompt's length as loadgen counted it
    status: int  # 0: no answer
    accepted: bool
    prompt_tokens: int | None = None  # usage, when accepted
    message: str | None = None  # why it was refused or failed


def _fits(advertised: int, tries: Sequence[PromptTry]) -> Finding:
    evidence = {"max_model_len": advertised, "tries": [t.__dict__ for t in tries]}
    near = [t for t in tries if t.tokens < advertised]
    over = [t for t in tries if t.tokens >= advertised]
    for t in near:
        if not t.accepted:
            why = f"HTTP {t.status}: {t.message}" if t.status else str(t.message)
            status = FINDING if t.status and 400 <= t.status < 500 else INFO
            return Finding("max_prompt", status, f"a prompt of {t.tokens} tokens was not accepted although /models "
                           f"says max_model_len {advertised} ({why})", evidence)
    for t in over:
        if t.accepted and t.prompt_tokens is not None and t.prompt_tokens < t.tokens:
            return Finding("max_prompt", FINDING, f"a prompt of {t.tokens} tokens, over max_model_len {advertised}, "
                           f"was accepted and cut to {t.prompt_tokens}: long prompts are truncated silently", evidence)
        if t.accepted:
            return Finding("max_prompt", INFO, f"a prompt of {t.tokens} tokens, over max_model_len {advertised}, was "
                           "accepted", evidence)
    shown = ", ".join(f"{t.tokens} {'accepted' if t.accepted else f'refused ({t.status})'}" for t in tries)
    return Finding("max_prompt", OK, f"prompts up to max_model_len {advertised} (less the output) are accepted: "
                   f"{shown}", evidence)


def max_prompt(advertised: int | None, tries: Sequence[PromptTry], cap: int, stopped: str | None = None) -> Finding:
    """The largest prompt the server takes: /models' max_model_len confirmed (a prompt just under it accepted,
    one over it refused), else what a bounded search found."""
    if advertised is not None and len(tries) == 2 and stopped is None:
        return _fits(advertised, tries)
    accepted = [t.tokens for t in tries if t.accepted]
    refused = [t for t in tries if not t.accepted and 400 <= t.status < 500]
    evidence: dict[str, Any] = {"max_model_len": advertised, "tries": [t.__dict__ for t in tries], "cap": cap,
                                "stopped": stopped}
    best = max(accepted, default=None)
    head = f"largest prompt accepted: {best} tokens" if best else "no long prompt was accepted"
    if refused:
        low = min(refused, key=lambda t: t.tokens)
        head += f"; {low.tokens} refused (HTTP {low.status})"
    elif best is not None and stopped is None:
        head = f"prompts of at least {best} tokens are accepted (the search stops at {cap})"
    note = f"; the search stopped: {stopped}" if stopped else ""
    source = " — /models gives no max_model_len" if advertised is None else f" (max_model_len {advertised})"
    return Finding("max_prompt", INFO, f"{head}{source}{note}", evidence)


def verdict(findings: Sequence[Finding]) -> tuple[str, int]:
    """(verdict, exit code): 0 clean (ok and info only), 1 a finding limits what can be measured, 2 a line
    cannot be measured at all."""
    worst = max((RANK[f.status] for f in findings), default=0)
    if worst >= RANK[FAIL]:
        return "cannot measure", EXIT_UNUSABLE
    if worst >= RANK[FINDING]:
        return "findings", EXIT_FINDINGS
    return "clean", EXIT_CLEAN


@dataclass
class CheckResult:
    """``loadgen check``'s outcome: one finding per line, the verdict and its exit code."""

    target: dict[str, Any]  # base_url (redacted), model, api, engine, embedded
    findings: list[Finding]
    requests: int  # every request the check sent, the preflight's included
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return verdict(self.findings)[0]

    @property
    def exit_code(self) -> int:
        return verdict(self.findings)[1]

    def finding(self, name: str) -> Finding:
        return next(f for f in self.findings if f.name == name)

    def limits(self) -> list[str]:
        """The names of the lines that limit (or rule out) measurement."""
        return [f.name for f in self.findings if RANK[f.status] >= RANK[FINDING]]

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "verdict": self.verdict, "exit_code": self.exit_code,
                "findings": [f.to_json() for f in self.findings], "requests": self.requests,
                "elapsed_s": round(self.elapsed_s, 2), "notes": self.notes}


__all__ = ["CheckResult", "PromptTry", "tokenize_endpoint", "metrics_endpoint", "http_version", "compression",
           "keep_alive", "max_prompt", "verdict", "EXIT_CLEAN", "EXIT_FINDINGS", "EXIT_UNUSABLE", "OK", "INFO",
           "FINDING", "FAIL"]
