"""``loadgen``'s entry point: the process policy (output redaction, SIGTERM as an interrupt, exit codes from
run/exits.py: 0 pass, 1 SLO failed, 2 usage/config error (nothing sent), 3 inconclusive or interrupted, 4 internal
error), then the typer application of cli/app.py."""

from __future__ import annotations

from loadgen.cli.app import app


def main() -> None:
    from loadgen.core.secrets import install_output_redaction
    from loadgen.run import exits

    install_output_redaction()  # first: everything printed from here on passes the redactor
    exits.install_sigterm()
    raise SystemExit(exits.run_app(app))


__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
