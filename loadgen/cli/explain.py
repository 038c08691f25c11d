"""``loadgen explain [NAME]``: a metric's, objective's, cause's or figure's definition, as core/vocabulary.py
declares it (the one place the console, summary.md, report.html and the docs take them from)."""

from __future__ import annotations

import difflib
from typing import Optional

import typer

from loadgen.core.vocabulary import definition, names


def explain(name: Optional[str] = typer.Argument(None, help="a metric (ttft_ms), objective (ttft_ms.p99), cause "
                                                 "(prefill) or figure (lift); none: list every name")) -> None:
    """What a metric, objective, cause or figure means (its definition, unit and what one sample is)."""
    if name is None:
        for kind, known in names().items():
            typer.echo(f"{kind}: {', '.join(known)}")
        typer.echo("loadgen explain NAME: one of them (an objective too: METRIC.STAT, e.g. ttft_ms.p99)")
        return
    text = definition(name)
    if text is None:
        every = [n for known in names().values() for n in known]
        close = difflib.get_close_matches(name, every, n=1)
        hint = f"; did you mean {close[0]}?" if close else "; `loadgen explain` lists every name"
        typer.echo(f"error: {name!r} is no metric, objective, cause or figure{hint}", err=True)
        raise typer.Exit(2)
    typer.echo(text)
