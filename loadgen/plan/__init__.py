"""Stage 1, the plan: a scenario file → a validated ``Scenario`` → a seeded ``Plan`` of requests (when each is
due, its class, prompt and output lengths) → prompts and request bodies. Pure and deterministic: no network I/O
(a prompt's exact length may be measured by a token counter the run stage hands in)."""
