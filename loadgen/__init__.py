"""loadgen: load generator and SLO tester for LLM inference endpoints."""

__version__ = "0.1.0"
