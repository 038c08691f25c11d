"""Server settings the advisor varies: what the server ran with, the candidates to try, and each one as the
engine's own command-line flags. Pure.

The knobs are the simulator's scheduler fields (``local_target/sim/config.py``): ``chunked_prefill``,
``max_num_batched_tokens`` (the token budget per step: vLLM's, SGLang's ``--chunked-prefill-size``,
llama.cpp's ``n_batch``, TGI's ``--max-batch-prefill-tokens``) and ``max_num_seqs`` (vLLM's, SGLang's
``--max-running-requests``, llama.cpp's ``--parallel`` slots); TGI adds ``waiting_served_ratio`` and
``max_waiting_tokens``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any
from loadgen.errors import SettingsError as SettingsError

BUDGETS = (256, 512, 1024, 2048, 4096, 8192)
BUDGET_STEP = 16  # budgets tried between the grid's are multiples of this
MAX_CANDIDATES = 64
KNOBS: dict[str, type] = {"chunked_prefill": bool, "max_num_batched_tokens": int, "max_num_seqs": int,
                          "waiting_served_ratio": float, "max_waiting_tokens": int}
# When a run did not say what its server ran with (--server), each engine's defaults (as of late 2026)
ENGINE_DEFAULTS: dict[str, dict[str, Any]] = {
    "vllm": {"chunked_prefill": True, "max_num_batched_tokens": 8192, "max_num_seqs": 256},
    "sglang": {"chunked_prefill": True, "max_num_batched_tokens": 8192, "max_num_seqs": 256},
    "llamacpp": {"chunked_prefill": True, "max_num_batched_tokens": 2048, "max_num_seqs": 4},
    "tgi": {"chunked_prefill": False, "max_num_batched_tokens": 4096, "max_num_seqs": 256,
            "waiting_served_ratio": 1.2, "max_waiting_tokens": 20},
}


def parse_value(key: str, text: str) -> Any:
    kind = KNOBS.get(key)
    if kind is None:
        raise SettingsError(f"unknown server setting {key!r}; choose from {', '.join(KNOBS)}")
    text = text.strip().lower()
    try:
        if kind is bool:
            if text not in ("true", "false", "on", "off", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text in ("true", "on", "1", "yes")
        value = kind(text)
    except ValueError:
        raise SettingsError(f"{key}={text!r}: expected {kind.__name__}") from None
    if value <= 0 and key != "max_waiting_tokens" or value < 0:
        raise SettingsError(f"{key}={text}: must be positive")
    return value


def parse_items(items: list[str], many: bool) -> dict[str, list[Any]]:
    """``KEY=V`` (``--server``) or ``KEY=V1,V2`` (``--try``) items → key → values."""
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not values.strip():
            raise SettingsError(f"{item!r}: expected KEY=VALUE{',VALUE…' if many else ''}")
        parts = values.split(",") if many else [values]
        out[key] = [parse_value(key, v) for v in parts]
    return out


@dataclass(frozen=True)
class Candidate:
    """One server setting to replay: the knobs that differ from what the run's server had, and all of them."""

    label: str
    fields: dict[str, Any]

    def flags(self, engine: str) -> list[str]:
        return engine_flags(engine, self.fields)


def label_of(fields: dict[str, Any], engine: str, current: dict[str, Any] | None = None) -> str:
    """"chunked 512" (llama.cpp: "n_batch 512"), then each other knob that differs from ``current``."""
    if engine == "llamacpp":
        head = f"n_batch {fields['max_num_batched_tokens']}"
    else:
        head = f"chunked {fields['max_num_batched_tokens']}" if fields.get("chunked_prefill") else "chunked off"
    extra = [f"{k} {v}" for k, v in fields.items() if k not in ("chunked_prefill", "max_num_batched_tokens")
             and (current is None or current.get(k) != v)]
    return ", ".join([head, *extra])


def candidates(current: dict[str, Any], engine: str, tries: dict[str, list[Any]]) -> list[Candidate]:
    """The current setting first, then the grid: ``tries`` where given, else chunked prefill off and on with
    each budget of ``BUDGETS`` (at least ``max_num_seqs``), at the current ``max_num_seqs``."""
    if tries:
        grid = {key: tries.get(key, [current.get(key)]) for key in KNOBS if key in tries or key in current}
    elif engine == "llamacpp":
        grid = {"max_num_batched_tokens": list(BUDGETS)}
    else:
        grid = {"chunked_prefill": [False, True], "max_num_batched_tokens": list(BUDGETS)}
    out = [Candidate(label_of(current, engine, current) + " (current)", dict(current))]
    seen = {_key(current, engine)}
    for combo in itertools.product(*grid.values()):
        fields = {**current, **dict(zip(grid, combo))}
        if engine != "llamacpp" and not fields.get("chunked_prefill") and "max_num_batched_tokens" not in tries:
            fields["max_num_batched_tokens"] = current["max_num_batched_tokens"]
        if fields.get("chunked_prefill", True) and fields["max_num_batched_tokens"] < fields["max_num_seqs"]:
            continue  # a budget below the batch size cannot schedule every decode
        if _key(fields, engine) in seen:
            continue
        seen.add(_key(fields, engine))
        out.append(Candidate(label_of(fields, engine, current), fields))
    if len(out) > MAX_CANDIDATES:
        raise SettingsError(f"{len(out)} candidates: at most {MAX_CANDIDATES} (fewer --try values)")
    return out


def budgets_between(fields: dict[str, Any], tried: list[dict[str, Any]], engine: str) -> list[dict[str, Any]]:
    """A chunked setting with its budget halfway (to ``BUDGET_STEP`` tokens) to each of its nearest tried
    budgets below and above (the other knobs the same), those not tried yet: where to look next between the
    grid's budgets. None for an unchunked setting."""
    def chunked(f: dict[str, Any]) -> bool:
        return bool(f.get("chunked_prefill")) or engine == "llamacpp"

    if not chunked(fields):
        return []
    others = [k for k in KNOBS if k not in ("chunked_prefill", "max_num_batched_tokens")]
    budgets = sorted({f["max_num_batched_tokens"] for f in tried
                      if chunked(f) and all(f.get(k) == fields.get(k) for k in others)})
    b = fields["max_num_batched_tokens"]
    near = [x for x in budgets if x < b][-1:] + [x for x in budgets if x > b][:1]
    mids = sorted({round((b + n) / 2 / BUDGET_STEP) * BUDGET_STEP for n in near})
    return [{**fields, "max_num_batched_tokens": m} for m in mids
            if m not in budgets and m != b and m >= fields.get("max_num_seqs", 1)]


def _key(fields: dict[str, Any], engine: str) -> tuple[Any, ...]:
    chunked = fields.get("chunked_prefill") or engine == "llamacpp"
    return (chunked, fields["max_num_batched_tokens"] if chunked else None, fields["max_num_seqs"],
            fields.get("waiting_served_ratio"), fields.get("max_waiting_tokens"))


def engine_flags(engine: str, f: dict[str, Any]) -> list[str]:
    """The server's command-line flags for these settings."""
    if engine == "sglang":
        size = f["max_num_batched_tokens"] if f.get("chunked_prefill") else -1
        return [f"--chunked-prefill-size {size}", f"--max-running-requests {f['max_num_seqs']}"]
    if engine == "llamacpp":
        return [f"--batch-size {f['max_num_batched_tokens']}", f"--parallel {f['max_num_seqs']}"]
    if engine == "tgi":
        return [f"--max-batch-prefill-tokens {f['max_num_batched_tokens']}",
                f"--max-concurrent-requests {f['max_num_seqs']}",
                f"--waiting-served-ratio {f.get('waiting_served_ratio', 1.2)}",
                f"--max-waiting-tokens {f.get('max_waiting_tokens', 20)}"]
    if not f.get("chunked_prefill"):
        return ["--no-enable-chunked-prefill", f"--max-num-seqs {f['max_num_seqs']}"]
    return ["--enable-chunked-prefill", f"--max-num-batched-tokens {f['max_num_batched_tokens']}",
            f"--max-num-seqs {f['max_num_seqs']}"]


def simulator_flags(f: dict[str, Any]) -> list[str]:
    """The same settings for the embedded simulator (``loadgen run --set …``)."""
    keys = [k for k in ("chunked_prefill", "max_num_batched_tokens", "max_num_seqs", "waiting_served_ratio",
                        "max_waiting_tokens") if k in f]
    return [f"--set target.simulator.{k}={str(f[k]).lower()}" for k in keys]
