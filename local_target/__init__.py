"""Bundled targets for loadgen: a CPU simulator of a continuous-batching engine (``sim``)."""
