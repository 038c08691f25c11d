"""A bundled real server (vLLM, llama.cpp's llama-server) as a child process: started in its own session so one
signal reaches all of its processes, output to a log file, ready when ``GET /health`` answers 200, stopped by
SIGINT to the whole group (SIGKILL if it does not go)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

import httpx


class LaunchError(RuntimeError):
    """The server cannot be started as asked; the message says what to install or change."""


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (a server already there would also answer /health, and
    the wait for readiness would be fooled by it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class ServerProcess:
    def __init__(self, command: list[str], health_url: str, name: str, log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.command, self.health_url, self.name, self.log_path = command, health_url, name, log_path
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, env={**os.environ, **self.env})
        log.close()

    def wait_ready(self, timeout_s: float, on_wait: Callable[[float], None] = lambda _: None) -> None:
        """Until GET /health answers 200; LaunchError (with the log's tail) if it exits or time runs out."""
        assert self.process is not None
        t0 = time.monotonic()
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self.process.poll() is not None:
                    raise LaunchError(f"{self.name} exited with code {self.process.returncode} while starting:\n"
                                      f"{self.log_tail()}")
                elapsed = time.monotonic() - t0
                if elapsed > timeout_s:
                    raise LaunchError(f"{self.name} was not healthy within {timeout_s:g} s:\n{self.log_tail()}")
                try:
                    if client.get(self.health_url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                on_wait(elapsed)
                _pause(0.5)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGINT to the whole group (the server's own Ctrl-C shutdown), SIGKILL after ``timeout_s``."""
        p = self.process
        if p is None or p.poll() is not None:
            return p.returncode if p else None
        for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        return p.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def _pause(seconds: float) -> None:
    time.sleep(seconds)  # between /health polls of a starting server (not a test's synchronisation)
