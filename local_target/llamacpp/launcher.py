"""Start llama.cpp's ``llama-server`` with the flags that matter to a prefill/decode load test: ``slots``
parallel sequences with continuous batching, prompts processed in ``n_batch``-token slices alongside the
running decodes, prompt caching off (every prompt pays its whole prefill, as vLLM's prefix caching off does),
Prometheus ``/metrics`` on. ``command_line`` is pure (unit-tested); ``preflight`` says what is missing."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from local_target.server_process import LaunchError, ServerProcess, port_free


@dataclass
class LlamaOptions:
    model: Path  # a GGUF file
    binary: Path = Path("llama-server")
    slots: int = 4  # --parallel
    ctx_per_slot: int = 4096  # --ctx-size is slots × this
    n_batch: int = 2048  # --batch-size: prompt tokens (with the decodes) per step
    n_ubatch: int = 512
    threads: int = 1
    host: str = "127.0.0.1"
    port: int = 8000
    extra_args: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/v1"


def command_line(o: LlamaOptions) -> list[str]:
    return [str(o.binary), "--model", str(o.model), "--host", o.host, "--port", str(o.port),
            "--parallel", str(o.slots), "--ctx-size", str(o.slots * o.ctx_per_slot), "--cont-batching",
            "--batch-size", str(o.n_batch), "--ubatch-size", str(min(o.n_ubatch, o.n_batch)),
            "--threads", str(o.threads), "--threads-batch", str(o.threads), "--no-cache-prompt", "--metrics",
            "--no-webui", *o.extra_args]


def preflight(o: LlamaOptions) -> None:
    """Raise LaunchError naming what is wrong; nothing is started."""
    if not Path(o.model).is_file():
        raise LaunchError(f"--model {o.model}: no such GGUF file (make one offline with "
                          f"`loadgen target tiny-gguf {o.model}`)")
    if not (Path(o.binary).is_file() and os.access(o.binary, os.X_OK)):
        raise LaunchError(f"{o.binary}: llama-server is not there or not executable")
    if not port_free(o.host, o.port):
        raise LaunchError(f"port {o.port} on {o.host} is already in use (another server?): stop it or pass --port")


class LlamaServer(ServerProcess):
    def __init__(self, options: LlamaOptions, log_path: Path) -> None:
        super().__init__(command_line(options), options.base_url.removesuffix("/v1") + "/health", "llama-server",
                         log_path)
        self.options = options
