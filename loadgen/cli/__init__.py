"""The command line (typer): ``loadgen run | sweep | report | compare | validate | history | ui | worker | target``.
Commands parse flags and call ``loadgen.api``; exit codes are the verdict's."""

from loadgen.cli.main import app, main

__all__ = ["app", "main"]
