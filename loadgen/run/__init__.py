"""Stage 2, the run: everything with side effects around the drivers — resolving the target (model, engine,
tokenizer), preparing prompts, the record sink (Parquet parts), scraping the server's /metrics, signals and exit
codes, the Locust orchestration, and reading a run directory back for ``report`` and ``compare``."""
