"""``loadgen dataset sample|sample-trace|inspect``: write the bundled sample dataset or trace; check how loadgen
reads a dataset file (rows, turns, estimated lengths) before a scenario uses it."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Optional

import typer

from loadgen.cli.aliases import Group
from loadgen.cli.common import console, fail
from loadgen.core.secrets import write_text
from loadgen.errors import ScenarioError

app = typer.Typer(cls=Group, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Prompt datasets: write the bundled samples (sample, sample-trace), or inspect a dataset file "
                  "or an agent trace as loadgen reads it.")


@app.command()
def sample(out: Path = typer.Option(Path("scenarios/data/sharegpt_sample.json"), "--out", help="where to write it"),
           conversations: int = typer.Option(100, "--conversations", min=1, max=100_000,
                                             help="conversations to write"),
           seed: int = typer.Option(0, "--seed", help="the generator's seed (the same seed, the same file)")) -> None:
    """Write the sample ShareGPT-format dataset (generated from the seed; nothing is downloaded)."""
    from loadgen.plan.sample_dataset import sample_json  # in each command: `loadgen --help` starts without plan/

    write_text(out, sample_json(conversations, seed))
    console.print(f"{conversations} conversations → {out}", highlight=False)


@app.command("sample-trace")
def sample_trace(out: Path = typer.Option(Path("scenarios/data/mooncake_sample.jsonl"), "--out",
                                         help="where to write it"),
                 requests: int = typer.Option(120, "--requests", min=1, max=1_000_000, help="requests to write"),
                 seed: int = typer.Option(0, "--seed", help="the generator's seed (the same seed, the same file)")
                 ) -> None:
    """Write the sample Mooncake-format trace (shared system prompts, growing sessions; generated)."""
    from loadgen.plan.sample_dataset import mooncake_jsonl

    write_text(out, mooncake_jsonl(requests, seed))
    console.print(f"{requests} requests → {out}", highlight=False)


@app.command()
def inspect(path: Path = typer.Argument(..., help="a dataset file (jsonl, csv, parquet, ShareGPT json), a "
                                        "saved Hugging Face dataset directory, or an agent trace"),
            format: str = typer.Option("auto", "--format", help="auto (an agent trace by its first document, else a "
                                       "dataset by its suffix), jsonl, csv, parquet, sharegpt or hf; agent traces: "
                                       "weka, otel or loadgen"),
            prompt_column: str = typer.Option("prompt", "--prompt-column", help="the column of the prompt text "
                                              "(a scenario's dataset.prompt_column)"),
            messages_column: Optional[str] = typer.Option(None, "--messages-column", help="a column of chat "
                                                          "messages instead (dataset.messages_column)"),
            output_column: Optional[str] = typer.Option(None, "--output-column", help="the column of a recorded "
                                                        "answer, if any (dataset.output_column)")) -> None:
    """How a scenario's ``dataset:`` would read the file: rows, turns per row, estimated lengths; or how a
    class's ``session.trace`` would read an agent trace (``--format auto`` tells one by its first document)."""
    from pydantic import ValidationError

    from loadgen.plan.agent_traces import trace_format_of
    from loadgen.plan.datasets import format_of, rows_for
    from loadgen.plan.scenario import DatasetSpec

    if not path.exists():
        raise fail(f"{path}: no such file")
    auto = format == "auto"
    format = (trace_format_of(path) or format) if auto else format
    if format in ("weka", "otel", "loadgen"):
        return _inspect_trace(path, format)
    try:
        spec = DatasetSpec(path=path, format=format, prompt_column=prompt_column,  # type: ignore[arg-type]
                           messages_column=messages_column, output_column=output_column)
        rows = rows_for(spec, need_answers=False)
    except ValidationError as exc:
        raise fail(f"--format {format!r}: {exc.errors()[0]['msg']}") from None
    except ScenarioError as exc:
        raise fail(_unrecognised(path, str(exc)) if auto else str(exc)) from None
    turns = [len(r.turns) for r in rows]
    prompts = sorted(r.prompt_estimate() for r in rows)
    answered = sum(1 for r in rows if r.answer_estimate(0))
    console.print(f"{path}: {format_of(spec)}, {len(rows)} rows; turns per row: mean "
                  f"{statistics.mean(turns):.2f}, max {max(turns)} ({sum(t > 1 for t in turns)} multi-turn); "
                  f"first prompt ≈ {prompts[len(prompts) // 2]} tokens at the median, {prompts[-1]} at most; "
                  f"{answered} rows with a recorded answer", highlight=False)


def _inspect_trace(path: Path, format: str) -> None:
    """How a class's ``session.trace`` would read an agent trace (recorded waits uncapped)."""
    from loadgen.plan.agent_traces import describe, read_agent_trace
    from loadgen.plan.session_spec import SessionTrace

    try:
        sessions = read_agent_trace(SessionTrace(path=path, format=format, max_wait_s=3600))  # type: ignore[arg-type]
    except ScenarioError as exc:
        raise fail(str(exc)) from None
    console.print(f"{path}: {format} agent trace, {describe(sessions)}", highlight=False)


def _unrecognised(path: Path, why: str) -> str:
    """``--format auto`` found neither a dataset it reads nor an agent trace: what it expected, and why not."""
    why = why.removeprefix(f"dataset {path}: ").split(": set dataset.format")[0]  # the flag is named below
    return (f"{path}: --format auto reads no dataset or agent trace here ({why}); expected a dataset (jsonl, csv, "
            "parquet, ShareGPT json, a saved Hugging Face dataset directory) or an agent trace (WEKA JSON/JSONL, "
            "OpenTelemetry spans or OTLP JSON, loadgen sessions JSONL); or name one with --format")
