"""The product: a run's raw records as Parquet. Their columns and types (``schema.py``), the sink that writes
them while the run goes (``sink.py``), the part files merged in tiers (``parts.py``), and reading a run
directory's records back, eagerly or as a lazy scan (``scan.py``). The record types themselves are the core's
(``core/records.py``, standard library only)."""
