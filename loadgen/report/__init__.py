"""Views of a run, written from its summary (itself recomputed from the raw records)."""

from loadgen.report.writers import write_all

__all__ = ["write_all"]
