"""The request bodies ``loadgen run`` sends for a reduced set, built at shrink time as the run builds them, for
``repro.py`` to send byte for byte.

The written scenario (``writers.write_scenario``) is planned and prepared through the run's own path
(``run/prepare.py``): its target resolved (the embedded simulator started as the run started it, or the run's
URL), the prompt factory fitted to the target's tokenizer (``plan/workload.py``: each prompt counted by the
server's ``/tokenize``, a local tokenizer file, or a fit to ``usage``, and nudged until the count agrees where the
counter is exact), then each trace row's body. Prompts are seeded by the scenario's seed and the row, so these are
the bodies every confirmation run sent. When the target cannot be prepared (not reachable now), there are none
and ``repro.py`` falls back to generated words, with the reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.errors import LoadgenError
from loadgen.plan.scenario import Scenario
from loadgen.plan.scenario_file import load_scenario
from loadgen.plan.schedule import build_plan
from loadgen.plan.until_spec import horizon
from loadgen.plan.workload import LocalTokenizerCounter, TokenizeEndpointCounter, build_prompts
from loadgen.run.prepare import Prepared, Preparation
from loadgen.run.runner import event_loop_run
from loadgen.run.target import start_embedded

SCRIPT_APIS = ("chat", "completions")  # the APIs standalone.py speaks


@dataclass
class Bodies:
    """Each trace row's JSON body as loadgen sends it (``[]``: none could be built, ``why`` says why)."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    counted: list[int | None] = field(default_factory=list)  # each prompt's tokens as the counter counted them
    asked: list[int] = field(default_factory=list)  # each row's prompt_tokens
    counter: str = ""  # how the prompts were counted, in words
    exact: bool = False  # the counter is the target's own (exact) and every prompt has its asked length
    why: str = ""  # why there are no bodies

    @property
    def built(self) -> bool:
        return bool(self.bodies)


def counter_words(counter: Any, dialect: str | None) -> tuple[str, bool]:
    """How ``counter`` counts, and whether it is exact."""
    if isinstance(counter, TokenizeEndpointCounter):
        return f"the target's own tokenizer ({dialect} tokenize endpoint, chat template applied)", True
    if isinstance(counter, LocalTokenizerCounter):
        return "a local tokenizer file plus the template's measured overhead", True
    return "a words-to-tokens fit to the target's usage (no tokenizer: approximate)", False


async def prepared_bodies(prepared: Prepared) -> Bodies:
    """Each planned request's body as ``loadgen run`` sends it: its prompt from the run's factory (as
    ``runner._prepare_prompts``), its body from ``Prepared.body`` (as the engine's ``body_for``)."""
    requests = prepared.plan.requests or []
    prepared.factory.count_every_prompt()  # each body's length the target's own count (docs/shrink.md), no sample
    prompts = await build_prompts(prepared.factory, requests)
    bodies = [await prepared.body(req, prompts[req.seq]) for req in requests]
    words, exact = counter_words(prepared.factory.counter, prepared.target.tokenize_dialect)
    counted = [prompts[r.seq].tokens for r in requests]
    asked = [r.prompt_tokens for r in requests]
    return Bodies(bodies, counted, asked, words, exact and counted == asked)


async def _bodies(scenario: Scenario, base_url: str) -> Bodies:
    prep = Preparation(horizon(scenario), build_plan(horizon(scenario)), base_url)
    async with prep.open_client() as client:
        return await prepared_bodies(await prep.prepare(client))


def build_bodies(scenario_path: Path) -> Bodies:
    """The bodies of the scenario at ``scenario_path`` (a shrink's trace scenario), in trace row order; none (with
    the reason) when its target cannot be started or prepared."""
    try:
        scenario = load_scenario(scenario_path)
        if scenario.target.api not in SCRIPT_APIS:
            api = scenario.target.api
            return Bodies(why=f"repro.py speaks {' and '.join(SCRIPT_APIS)}, not the target's {api} API")
        sim = start_embedded(scenario, None) if scenario.target.embedded else None
        try:
            built: Bodies = event_loop_run(_bodies(scenario, sim.base_url if sim else scenario.target.base_url))
            return built
        finally:
            if sim is not None:
                sim.stop()
    except (LoadgenError, OSError, asyncio.TimeoutError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Bodies(why=f"the target could not be prepared ({first})")
