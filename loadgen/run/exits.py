"""One exit-code contract for every command, and the top-level handler that keeps it.

    0  pass (compare: no regression; other commands: done)
    1  an SLO failed (compare: a metric regressed)
    2  usage or configuration error: nothing was sent
    3  inconclusive: the generator lagged, too few samples, the run was interrupted or did not finish, the disk
       filled up, requests were cut by the run's deadline, or no request completed
    4  internal error: a bug in loadgen; the traceback is written to a file named on stderr

Any exception that reaches the top is turned into one line on stderr (exit 4); SIGINT and SIGTERM outside a run's
own handlers end loadgen with exit 3 and a line saying where the records are. Records already taken are flushed
by the run as it goes, so none is lost on the way out.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from loadgen.core.secrets import clip, write_text

PASS, SLO_FAILED, USAGE, INCONCLUSIVE, INTERNAL = 0, 1, 2, 3, 4
TYPER_INTERRUPTED = 130


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived before the run started sending."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is where no run has its own handler."""


# Where the process is, for the last words of an interrupt or a crash (set by the runner).
current: dict[str, Any] = {"run_dir": None, "phase": "starting"}


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def install_sigterm() -> None:
    """SIGTERM acts as Ctrl-C wherever a run has not installed its own handlers (preflight, reports)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def crash_report(exc: BaseException) -> Path:
    """Write the traceback (redacted) into the run directory if there is one and it takes it, else the temp
    directory."""
    run_dir = current.get("run_dir")
    text = "".join(traceback.format_exception(exc))
    fallback = Path(tempfile.gettempdir()) / f"loadgen-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    for path in ([Path(run_dir) / "crash.txt"] if run_dir and Path(run_dir).is_dir() else []) + [fallback]:
        try:
            write_text(path, text)
            return path
        except OSError:
            continue
    return fallback


def interrupted_line() -> str:
    run_dir, phase = current.get("run_dir"), current.get("phase")
    if phase in ("starting", "preflight") or run_dir is None:
        return "interrupted before anything was sent"
    return (f"interrupted while {phase}; the records taken are kept in {run_dir} "
            f"(`loadgen report {run_dir}` rebuilds the reports)")


def _usage_error_types() -> tuple[type[BaseException], ...]:
    """Click's usage errors: typer 0.29+ vendors click (typer._click), older typer uses click itself."""
    found: list[type[BaseException]] = []
    try:
        from typer._click.exceptions import ClickException
        found.append(ClickException)
    except ImportError:
        pass
    try:
        import click
        found.append(click.ClickException)
    except ImportError:
        pass
    return tuple(found)


def _show_usage_error(exc: Any) -> None:
    try:  # typer's own framing (a box naming the command and its --help), as in standalone mode
        from typer import rich_utils
        rich_utils.rich_format_error(exc)
    except Exception:  # noqa: BLE001 - plain text when typer's rich helper is not there
        exc.show()


def run_app(app: Any) -> int:
    """Run the typer app under the contract above; returns the exit code."""
    import typer

    try:
        code = app(standalone_mode=False)
    except _usage_error_types() as exc:
        _show_usage_error(exc)
        return USAGE
    except (typer.Abort, KeyboardInterrupt, Interrupted):
        print(f"loadgen: {interrupted_line()}", file=sys.stderr, flush=True)
        return INCONCLUSIVE
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else INTERNAL)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, a file, exit 4
        path = crash_report(exc)
        message = clip(str(exc).splitlines()[0], 200) if str(exc) else ""  # the cut marked: a key's head masked
        print(f"loadgen: internal error ({type(exc).__name__}: {message}); traceback written to {path} "
              "— please report it", file=sys.stderr, flush=True)
        return INTERNAL
    if code == TYPER_INTERRUPTED:  # typer turns KeyboardInterrupt (our SIGTERM too) into exit 130
        print(f"loadgen: {interrupted_line()}", file=sys.stderr, flush=True)
        return INCONCLUSIVE
    return code if isinstance(code, int) else PASS
