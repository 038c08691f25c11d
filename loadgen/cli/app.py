"""The ``loadgen`` typer application, whole at import: every command is registered here, explicitly, from the
modules that define it (no registration by import side effect, so ``loadgen.cli.app.app`` is the same object
whether or not ``main()`` has run, and static tools see every edge)."""

from __future__ import annotations

import typer

import loadgen
from loadgen.cli import advise, bench_client, commands, dataset, explain, run, scenario, shrink, size, sweep, target
from loadgen.cli.aliases import AliasGroup

# rich_markup_mode=None: click's plain help, which wraps long option names and help at any width; typer's rich
# panels cut them with "…" at 80 columns (`loadgen run -h` lost --prompt-tokens, --server-metrics-period).
app = typer.Typer(cls=AliasGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Load generator and SLO tester for OpenAI-compatible LLM endpoints.")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"loadgen {loadgen.__version__}")
        raise typer.Exit(0)


@app.callback()
def root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                      help="print loadgen's version and exit")) -> None:
    """Load generator and SLO tester for OpenAI-compatible LLM endpoints."""


for command in (run.run, commands.ui, commands.worker, commands.validate, commands.schema, commands.check,
                commands.report, commands.compare, commands.history, sweep.sweep, advise.advise, size.size,
                shrink.shrink, explain.explain):
    app.command()(command)
app.command("bench-client")(bench_client.bench_client)
app.add_typer(target.app, name="target")
app.add_typer(dataset.app, name="dataset")
app.add_typer(scenario.app, name="scenario")

__all__ = ["app"]
