"""Start the simulator in a child process (its own interpreter, GIL and loop) and stop it.

The child never outlives its parent: it runs in its own session (a terminal's Ctrl-C goes to the parent, which
stops it in order) and, on Linux, asks the kernel for SIGTERM when the parent dies (``PR_SET_PDEATHSIG``), so a
SIGKILL or an out-of-memory kill of the parent takes it down too.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .config import EngineConfig

READY_PREFIX = "loadgen-sim listening on "


class SimulatorStartError(RuntimeError):
    pass


@dataclass
class SimProcess:
    base_url: str  # ends in /v1
    process: subprocess.Popen[str]
    trace_path: Path | None

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code. The trace is flushed on SIGTERM."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        return self.process.returncode

    def __enter__(self) -> "SimProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_simulator(cfg: EngineConfig, trace_path: Path | None = None, host: str = "127.0.0.1",
                    port: int = 0, cpu: int | None = None, timeout_s: float = 30.0) -> SimProcess:
    """Start ``python -m local_target.sim`` with ``cfg``; return once it listens. ``cpu`` pins it to one core."""
    cmd = [sys.executable, "-m", "local_target.sim", "--config-json", cfg.model_dump_json(),
           "--host", host, "--port", str(port)]
    if trace_path is not None:
        cmd += ["--trace", str(trace_path)]
    parent = os.getpid()

    def preexec() -> None:
        die_with_parent(parent)
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=preexec, env=env,
                            start_new_session=True)
    line = _read_ready_line(proc, timeout_s)
    return SimProcess(line.split()[0], proc, trace_path)


PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """In a child before exec: SIGTERM when the parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _read_ready_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if sel.select(timeout=deadline - time.monotonic()):
                line = proc.stdout.readline()
                if line.startswith(READY_PREFIX):
                    return line[len(READY_PREFIX):].strip()
                if not line:
                    break
    finally:
        sel.close()
    proc.kill()
    proc.wait()
    raise SimulatorStartError(f"simulator did not start (exit code {proc.returncode}); see its stderr above")
