"""The ``loadgen`` typer application, whole at import: every command is registered here, explicitly, from the
modules that define it (no registration by import side effect, so ``loadgen.cli.app.app`` is the same object
whether or not ``main()`` has run, and static tools see every edge)."""

from __future__ import annotations

import typer

from loadgen.cli import advise, commands, dataset, run, shrink, size, sweep, target

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Load generator and SLO tester for OpenAI-compatible LLM endpoints.")

for command in (run.run, commands.ui, commands.worker, commands.validate, commands.schema, commands.check,
                commands.report, commands.compare, commands.history, sweep.sweep, advise.advise, size.size,
                shrink.shrink):
    app.command()(command)
app.add_typer(target.app, name="target")
app.add_typer(dataset.app, name="dataset")

__all__ = ["app"]
