"""Every error loadgen raises on purpose, in one tree (as httpx draws its own), so a caller of ``loadgen.api``
can catch one class per decision. Standard library only: every stage may import it.

    LoadgenError
    ├── InputError (ValueError)      bad input: one line naming what is wrong; exit 2, nothing sent
    │   ├── ScenarioError            a scenario file, override or flag (plan/)
    │   ├── SettingsError            a --try or --server item of ``loadgen advise``
    │   ├── AdviceError              a run that cannot be advised on
    │   ├── CompareError             a run directory that cannot be compared
    │   └── RunDirError              a run directory that cannot be read
    └── ServerFault (RuntimeError)   a server's answer failed a step loadgen needed (counting a prompt mid-run):
        │                            during a run, the request's counted error (``protocol``), never a crash
        └── TargetError              before anything is sent: the target cannot be used; exit 2

Anything else raised inside loadgen is a bug: exit 4 with a crash report (run/exits.py). Ctrl-C and SIGTERM are
control flow, not errors (``run.exits.Interrupted``)."""

from __future__ import annotations


class LoadgenError(Exception):
    """The root of loadgen's own errors."""


class InputError(LoadgenError, ValueError):
    """Bad input (exit 2, before anything is sent); the message is one line a user can act on."""


class ScenarioError(InputError):
    """A bad scenario file or override; the message is one line a user can act on."""


class SettingsError(InputError):
    """A --try or --server item that names no knob or has a bad value (exit 2)."""


class AdviceError(InputError):
    """A run that cannot be advised on (exit 2): too few completed requests, nothing to fit."""


class CompareError(InputError):
    """A run directory that cannot be compared (exit 2)."""


class RunDirError(InputError):
    """A run directory that cannot be read: no run.json, a malformed one, or damaged records (one line)."""


class ServerFault(LoadgenError, RuntimeError):
    """A server's answer (or the way to it) failed a step loadgen needed, such as counting a prompt mid-run: the
    server's fault, counted as the request's error. Any other exception while preparing a request is a bug in
    loadgen (``internal``, exit 4). The target's ``TargetError`` is one."""


class TargetError(ServerFault):
    """The target cannot be used; the message is one line naming what is wrong."""


__all__ = ["AdviceError", "CompareError", "InputError", "LoadgenError", "RunDirError", "ScenarioError",
           "ServerFault", "SettingsError", "TargetError"]
