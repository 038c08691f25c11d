"""Views of a run, written from its summary (itself recomputed from the raw records)."""

from .writers import write_all

__all__ = ["write_all"]
