"""Analysis: pure polars over the raw records (no I/O, no clock)."""
