"""``loadgen shrink``: the smallest reproduction of one stall of a run (docs/shrink.md)."""
