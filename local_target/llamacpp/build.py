"""Build llama.cpp's ``llama-server`` (CPU) from the sources vendored in PyPI's ``llama-cpp-python`` sdist, once
per machine: the binary is cached under the user's cache directory and reused while it still runs.

Steps: ``pip download`` the pinned sdist (no wheel: the sdist carries llama.cpp's sources), unpack it, configure
with cmake (server only, no web UI download, no OpenSSL, portable CPU flags), build ``llama-server`` with one job
per core (about 6 minutes on 2 cores), copy the binary into the cache. Each step is reported through
``progress``; a failure names the step and the tail of its log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

SDIST_VERSION = "0.3.36"  # llama-cpp-python's sdist whose vendored llama.cpp was tested here
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF",
               "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"]


class BuildError(RuntimeError):
    """llama-server could not be built; the message names the step and what to install or read."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loadgen" / "llamacpp" / SDIST_VERSION


def cached_binary() -> Path | None:
    """The cached llama-server if it is there and runs (``--version``), else None."""
    path = cache_dir() / "llama-server"
    if not path.is_file():
        return None
    try:
        ok = subprocess.run([str(path), "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return path if ok else None


def missing_tools() -> list[str]:
    return [tool for tool in ("cmake", "c++", "make") if shutil.which(tool) is None]


def ensure_llama_server(progress: Callable[[str], None] = lambda line: None) -> Path:
    """The path of a working llama-server: the cached one, or a fresh build (then cached)."""
    found = cached_binary()
    if found:
        return found
    missing = missing_tools()
    if missing:
        raise BuildError(f"building llama-server needs {', '.join(missing)}: install them "
                         "(Debian: apt-get install cmake g++ make)")
    with tempfile.TemporaryDirectory(prefix="loadgen-llamacpp-") as tmp:
        work = Path(tmp)
        progress(f"downloading llama-cpp-python {SDIST_VERSION}'s sdist from PyPI …")
        sources = unpack_sdist(download_sdist(work), work)
        progress("configuring llama.cpp with cmake …")
        _run(["cmake", "-S", str(sources), "-B", str(work / "build"), *CMAKE_FLAGS], work / "configure.log",
             "cmake configure")
        jobs = str(os.cpu_count() or 1)
        progress(f"building llama-server with {jobs} jobs (about 6 minutes on 2 cores; once per machine) …")
        _run(["cmake", "--build", str(work / "build"), "--target", "llama-server", "-j", jobs],
             work / "build.log", "cmake build")
        target = cache_dir() / "llama-server"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        shutil.copy2(work / "build" / "bin" / "llama-server", partial)
        partial.replace(target)  # atomic: a build cut short never leaves a broken binary in the cache
    progress(f"cached: {target}")
    return target


def download_sdist(work: Path) -> Path:
    out = work / "sdist"
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          f"llama-cpp-python=={SDIST_VERSION}", "-d", str(out)], work / "download.log", "pip download")
    found = sorted(out.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise BuildError(f"pip download left no llama_cpp_python sdist in {out}")
    return found[0]


def unpack_sdist(sdist: Path, work: Path) -> Path:
    with tarfile.open(sdist) as tar:
        tar.extractall(work / "src", filter="data")
    found = sorted((work / "src").glob("*/vendor/llama.cpp/CMakeLists.txt"))
    if not found:
        raise BuildError(f"{sdist.name} has no vendor/llama.cpp sources")
    return found[0].parent


def _run(cmd: list[str], log: Path, step: str) -> None:
    with open(log, "w") as fh:
        code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise BuildError(f"{step} failed (exit {code}):\n{tail}")
