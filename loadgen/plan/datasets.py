"""Prompts from files: JSONL, CSV, Parquet, ShareGPT JSON and (optional extra) a Hugging Face dataset saved on
disk, read into one shape — a row is a conversation: an optional system prompt, the user's turns in order and
the answer recorded after each (if the file has one).

- **jsonl / csv / parquet**: one row per record. ``prompt_column`` holds the prompt text, or ``messages_column``
  holds OpenAI chat messages (a list of ``{role, content}``; in CSV, its JSON text). ``output_column``, if
  given, holds the recorded answer (text) or its length (a number).
- **sharegpt**: a JSON list of ``{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}`` (the
  format of ShareGPT dumps and of vLLM's and GuideLLM's benchmarks). Leading ``gpt`` messages are skipped.
- **hf**: ``datasets.load_from_disk(path)`` (a dataset saved with ``save_to_disk``), then as jsonl: rows with
  ``prompt_column``/``messages_column``/``output_column``. Needs ``pip install 'loadgen[hf]'``.

Lengths here are estimates by one documented rule (a token is a run of word characters or one other
non-space character, as ``core.openai_stream.local_token_weight``); the plan filters by them and records them
as the asked lengths. What the server counted comes back in ``usage`` and is what every figure uses.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
from dataclasses import dataclass
from typing import Any

from loadgen.core.openai_stream import local_token_weight
from loadgen.core.secrets import clip
from loadgen.plan import nesting
from loadgen.plan.scenario import MAX_TOKENS, DatasetSpec, RequestClass, ScenarioError

CSV_FIELD_BYTES = 64 << 20  # one CSV field, at most (the csv module's default, 128 KiB, is a long prompt)


@dataclass(frozen=True)
class Row:
    system: str | None
    turns: tuple[str, ...]  # the user's messages
    answers: tuple[str | int | None, ...]  # the recorded answer after each turn (text, or its length), if any

    def prompt_estimate(self, turn: int = 0) -> int:
        """Estimated tokens of turn ``turn``'s new message (turn 0: with the system prompt)."""
        text = self.turns[turn] + (f"\n{self.system}" if turn == 0 and self.system else "")
        return estimate_tokens(text)

    def answer_estimate(self, turn: int) -> int | None:
        answer = self.answers[turn] if turn < len(self.answers) else None
        if answer is None or isinstance(answer, int):
            return answer
        return estimate_tokens(answer)


def estimate_tokens(text: str) -> int:
    return local_token_weight(text) if text.strip() else 0


def format_of(spec: DatasetSpec) -> str:
    if spec.format != "auto":
        return spec.format
    suffix = spec.path.suffix.lower()
    formats = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".json": "sharegpt"}
    if spec.path.is_dir():
        return "hf"
    if suffix not in formats:
        raise ScenarioError(f"dataset {spec.path}: cannot tell the format from '{suffix}': set dataset.format "
                            "(jsonl, csv, parquet, sharegpt or hf)")
    return formats[suffix]


def class_rows(cls: RequestClass, api: str) -> tuple[Row, ...]:
    """The rows ``cls`` draws from under ``target.api`` (the plan's row numbers index this)."""
    assert cls.dataset is not None
    return rows_for(cls.dataset, need_answers=cls.output_tokens is None and api != "embeddings")


@functools.lru_cache(maxsize=32)  # the plan and the prompt factory ask once per request
def rows_for(spec: DatasetSpec, need_answers: bool) -> tuple[Row, ...]:
    """The rows a class draws from: those that pass the length filter, in file order, and (when the output
    lengths come from the file) have a recorded answer to their first turn. ScenarioError names what is wrong."""
    rows = _load_rows(spec)
    if need_answers:
        rows = tuple(r for r in rows if r.answer_estimate(0))
        if not rows:
            raise ScenarioError(f"dataset {spec.path}: no row has a recorded answer to take output lengths from: "
                                "set dataset.output_column, or give the class output_tokens")
    return rows


@functools.lru_cache(maxsize=16)
def _load_rows(spec: DatasetSpec) -> tuple[Row, ...]:
    fmt = format_of(spec)
    try:
        records = _read(spec, fmt)
    except OSError as exc:
        raise ScenarioError(f"dataset {spec.path}: cannot read: {exc.strerror or exc}") from None
    except ScenarioError:  # a ValueError too: named already (a row nested too deep)
        raise
    except (ValueError, UnicodeDecodeError, csv.Error) as exc:
        raise ScenarioError(f"dataset {spec.path}: not valid {fmt}: {clip(str(exc).splitlines()[0], 200)}") from None
    rows = [row for n, rec in enumerate(records, 1) if (row := _row(spec, fmt, rec, n)) is not None]
    kept = tuple(r for r in rows if spec.min_prompt_tokens <= r.prompt_estimate() <= spec.max_prompt_tokens)
    if not kept:
        raise ScenarioError(f"dataset {spec.path}: no usable rows ({len(rows)} read, none with an estimated "
                            f"prompt of {spec.min_prompt_tokens}..{spec.max_prompt_tokens} tokens)")
    return kept[:spec.max_rows] if spec.max_rows else kept


def _read(spec: DatasetSpec, fmt: str) -> list[Any]:
    if fmt == "sharegpt":
        data = nesting.loads(spec.path.read_text(encoding="utf-8"), f"dataset {spec.path}")
        if not isinstance(data, list):
            raise ValueError("a ShareGPT file is a JSON list of {conversations: [...]}")
        return data
    if fmt == "jsonl":
        return [_json_line(line, n, spec) for n, line in
                enumerate(spec.path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    if fmt == "csv":
        limit = csv.field_size_limit(CSV_FIELD_BYTES)
        try:
            return list(csv.DictReader(io.StringIO(spec.path.read_text(encoding="utf-8"))))
        finally:
            csv.field_size_limit(limit)
    if fmt == "parquet":
        import polars as pl

        return pl.read_parquet(spec.path).to_dicts()
    return _read_hf(spec)


def _json_line(line: str, n: int, spec: DatasetSpec) -> Any:
    try:
        return nesting.loads(line, f"dataset {spec.path}", n)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {n}: {exc}") from None


def _read_hf(spec: DatasetSpec) -> list[Any]:
    try:
        import datasets
    except ImportError:
        raise ScenarioError("dataset.format hf needs the datasets library: pip install 'loadgen[hf]'") from None
    loaded = datasets.load_from_disk(str(spec.path))
    if isinstance(loaded, datasets.DatasetDict):
        if spec.split not in loaded:
            raise ScenarioError(f"dataset {spec.path}: no split {spec.split!r} (has {', '.join(loaded)})")
        loaded = loaded[spec.split]
    rows: list[Any] = loaded.to_list()  # the datasets library ships no types
    return rows


def _row(spec: DatasetSpec, fmt: str, rec: Any, n: int) -> Row | None:
    if not isinstance(rec, dict):
        raise ScenarioError(f"dataset {spec.path}: record {n} is not an object")
    if fmt == "sharegpt":
        return _sharegpt_row(rec.get("conversations") or rec.get("conversation") or [], spec, n)
    if spec.messages_column:
        messages = rec.get(spec.messages_column)
        if isinstance(messages, str):
            try:
                messages = nesting.loads(messages, f"dataset {spec.path}: record {n}: {spec.messages_column}", 0)
            except json.JSONDecodeError as exc:
                raise ScenarioError(f"dataset {spec.path}: record {n}: {spec.messages_column} is not JSON "
                                    f"({exc})") from None
        row = _messages_row(messages, spec, n)
        answer = _answer(rec.get(spec.output_column), spec, n) if spec.output_column else None
        if row is None or answer is None or row.answers[-1] is not None:
            return row
        return Row(row.system, row.turns, row.answers[:-1] + (answer,))  # the answer to its last user turn
    prompt = rec.get(spec.prompt_column)
    if prompt is None:
        raise ScenarioError(f"dataset {spec.path}: record {n} has no column {spec.prompt_column!r} "
                            "(set dataset.prompt_column or dataset.messages_column)")
    if not str(prompt).strip():
        return None
    answer = _answer(rec.get(spec.output_column), spec, n) if spec.output_column else None
    return Row(None, (str(prompt),), (answer,))


def _answer(value: Any, spec: DatasetSpec, n: int) -> str | int | None:
    """A recorded answer: its text, or its length (a number of tokens, 1..MAX_TOKENS; NaN, infinities and
    lengths past any context window are ScenarioError naming the record)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        text = str(value)
        if not text.strip().isdigit():
            return text
        value = int(text)
    if not math.isfinite(value) or value > MAX_TOKENS:
        raise ScenarioError(f"dataset {spec.path}: record {n}: {spec.output_column} = {value!r} is not an answer "
                            f"length (a number of tokens up to {MAX_TOKENS:,})")
    return max(1, int(value))


ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system"}


def _sharegpt_row(messages: Any, spec: DatasetSpec, n: int) -> Row | None:
    if not isinstance(messages, list):
        raise ScenarioError(f"dataset {spec.path}: record {n}: conversations must be a list")
    return _messages_row([{"role": ROLES.get(str(m.get("from")), "user"), "content": m.get("value")}
                          for m in messages if isinstance(m, dict)], spec, n)


def _messages_row(messages: Any, spec: DatasetSpec, n: int) -> Row | None:
    """system? (user, assistant?)*: consecutive user messages are joined; leading assistant ones dropped."""
    if not isinstance(messages, list):
        raise ScenarioError(f"dataset {spec.path}: record {n}: {spec.messages_column or 'messages'} must be a list")
    system: str | None = None
    turns: list[str] = []
    answers: list[str | None] = []
    for m in messages:
        role, content = (m.get("role"), m.get("content")) if isinstance(m, dict) else (None, None)
        if not isinstance(content, str) or not content.strip():
            continue
        if role == "system" and not turns:
            system = content
        elif role == "assistant" and turns:
            answers[-1] = content if answers[-1] is None else f"{answers[-1]}\n{content}"
        elif role not in ("assistant", "system"):
            if turns and answers[-1] is None:
                turns[-1] += "\n" + content
            else:
                turns.append(content)
                answers.append(None)
    return Row(system, tuple(turns), tuple(answers)) if turns else None

