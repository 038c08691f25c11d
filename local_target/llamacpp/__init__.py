"""A real llama.cpp ``llama-server`` target: built from the llama.cpp sources vendored in PyPI's
``llama-cpp-python`` sdist (``build.py``), serving a tiny random-weight GGUF written offline (``tiny_gguf.py``),
started and stopped by ``launcher.py``. Never imports loadgen."""
