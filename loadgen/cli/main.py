"""``loadgen``'s entry point: the process policy (output redaction, SIGTERM as an interrupt, exit codes from
run/exits.py: 0 pass, 1 SLO failed, 2 usage/config error (nothing sent), 3 inconclusive or interrupted, 4 internal
error), then the typer application of cli/app.py. Start-up is paid for by the command that runs: ``--version``
is answered before the application is built, and building it imports no command's machinery (each command
imports what it runs in its body; tests/test_cli_startup.py, bench/startup.py)."""

from __future__ import annotations

import sys
from typing import Any

import loadgen


def main() -> None:
    if sys.argv[1:] == ["--version"]:  # nothing else to do: no application to build, nothing to redact
        print(f"loadgen {loadgen.__version__}", flush=True)
        raise SystemExit(0)
    from loadgen.cli.app import app
    from loadgen.core.secrets import install_output_redaction
    from loadgen.run import exits

    install_output_redaction()  # first: everything printed from here on passes the redactor
    exits.install_sigterm()
    raise SystemExit(exits.run_app(app))


def __getattr__(name: str) -> Any:
    """``loadgen.cli.main.app``, the typer application, imported when asked for (not by ``main --version``)."""
    if name == "app":
        from loadgen.cli.app import app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
