"""CPU simulator of a continuous-batching LLM server (vLLM-like) with ground truth.

Public API: ``EngineConfig``/``build_config``/``PRESETS`` (configuration), ``serve`` (in this process, for pure
unit tests), ``start_simulator`` (a child process: what loadgen's embedded target and the tests use),
``read_trace`` (ground truth), and the tokenizer rule in ``tokenizer``.
"""

from .config import DEFAULT_PRESET, PRESETS, EngineConfig, FaultConfig, build_config
from .costmodel import PrefillChunk, prefill_alone_ms, step_ms
from .launcher import SimProcess, SimulatorStartError, start_simulator
from .trace import read_trace

__all__ = ["DEFAULT_PRESET", "PRESETS", "EngineConfig", "FaultConfig", "build_config", "PrefillChunk",
           "prefill_alone_ms", "step_ms", "SimProcess", "SimulatorStartError", "start_simulator", "read_trace",
           "serve"]


def __getattr__(name: str):  # serve pulls in the server stack; import it only when asked
    if name == "serve":
        from .server import serve
        return serve
    raise AttributeError(name)
