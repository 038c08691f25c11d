"""Module boundaries (DESIGN §3): the core is stdlib-only; nothing but the Locust driver imports locust/gevent."""

from __future__ import annotations

import subprocess
import sys

import loadgen.core


def _modules_after(imports: str) -> set[str]:
    code = f"import sys; before = set(sys.modules); {imports}; print(' '.join(set(sys.modules) - before))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {name.split(".")[0] for name in out.split()}


def test_core_imports_only_the_standard_library():
    third_party = {m for m in _modules_after("import loadgen.core") if m not in sys.stdlib_module_names}
    assert third_party <= {"loadgen"}, third_party


def test_core_analysis_and_asyncio_engine_never_import_locust_or_gevent():
    loaded = _modules_after("import loadgen.core, loadgen.analysis.summary, loadgen.drivers.asyncio_engine, "
                            "loadgen.run.runner")
    assert not loaded & {"locust", "gevent", "geventhttpclient"}


def test_core_public_api_is_pinned():
    assert sorted(loadgen.core.__all__) == sorted([
        "CHUNK_COLUMNS", "REQUEST_COLUMNS", "ChunkRecord", "ErrorKind", "RequestRecord", "SseDecoder",
        "RequestMeta", "StreamTracker", "error_kind_for_status"])


def test_the_analysis_does_no_network_io():
    loaded = _modules_after("import loadgen.analysis.summary, loadgen.analysis.compare, loadgen.analysis.slo")
    assert not loaded & {"httpx", "httpcore", "locust", "gevent"}, loaded
