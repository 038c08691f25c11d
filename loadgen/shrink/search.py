"""``loadgen shrink RUN``: from a failing run, the smallest set of its requests that still reproduces one stall on
the same target (docs/shrink.md).

1. The event and the seed set (``event.py``).
2. ``ddmin`` (``ddmin.py``) over the seed set, the victim always kept, on the virtual-time replay
   (``predicate.py``): bounded by ``max_tries`` replays and ``timeout_s``.
3. Confirmation on the target (``confirm.py``): the final set run ``confirmations`` times by loadgen; when under
   ``needed`` of them reproduce, the next larger failing set ddmin saw is confirmed instead, while time is left.
4. The outputs (``writers.py``, ``figure.py``): scenario.yaml + trace.csv, repro.py (with the bodies loadgen sends
   for the final set on the target, ``bodies.py``), shrink.json, the figure.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from loadgen.plan.scenario import Scenario
from loadgen.shrink.bodies import Bodies, build_bodies
from loadgen.shrink.confirm import Confirmation, confirm
from loadgen.shrink.ddmin import DdminResult, Try, ddmin
from loadgen.shrink.event import Event, Item, ShrinkError, read_run, seed_set, select_event
from loadgen.shrink.figure import figure_spec, original_streams, write_figure
from loadgen.shrink.predicate import model_of, replay_gaps, victim_value_ms
from loadgen.shrink.restore import check_and_register, restored, sources, unexpanded
from loadgen.shrink.writers import (offsets_s, prompts_mode, role_of, script_text, write_json,
                                    write_scenario, write_script)

REQUIRED_SHARE = 0.8  # 4 of 5 confirmations
MAX_CANDIDATES = 4  # failing sets confirmed at most, smallest first


@dataclass
class ShrinkOptions:
    stall: int | None = None
    request: int | None = None
    out: Path | None = None  # default RUN/shrink-<event>/
    max_tries: int = 200
    timeout_s: float = 600.0
    confirmations: int = 5
    share: float = 0.5  # reproduced: the victim's gap >= share × the original gap
    png: bool = True  # figure.png beside its spec (vl-convert renders it: about a second)

    def check(self) -> None:
        if self.max_tries < 1:
            raise ShrinkError(f"--max-tries {self.max_tries}: at least 1")
        if not self.timeout_s > 0:
            raise ShrinkError(f"--timeout {self.timeout_s:g}: more than 0 seconds")
        if self.confirmations < 0:
            raise ShrinkError(f"--confirmations {self.confirmations}: 0 or more")
        if not 0 < self.share <= 1:
            raise ShrinkError(f"--share {self.share * 100:g}%: a percentage above 0, at most 100")


@dataclass
class ShrinkResult:
    out: Path
    event: Event
    items: list[Item]  # the final set, in send order
    replay_gap_ms: float
    search: DdminResult[Item]
    confirmation: Confirmation | None
    bodies: Bodies  # repro.py's request bodies (none: it falls back to generated words, ``bodies.why`` says why)
    reproduced: bool  # confirmed (>= 80 % of the runs), or with no confirmations asked: the replay reproduced
    doc: dict[str, Any]
    scenario: Scenario | None = None  # the run's (run.json's: masked headers), for the authentication hint

    @property
    def exit_code(self) -> int:
        """0 reproduced, 1 not, 2 the target could not be used in any confirmation (as ``loadgen run`` and
        ``check`` exit 2 for a target they cannot reach)."""
        if self.confirmation is not None and self.confirmation.target_down:
            return 2
        return 0 if self.reproduced else 1


def shrink(run_dir: Path, opts: ShrinkOptions, progress: Callable[[str, int, int], None] = lambda *a: None,
           clock: Callable[[], float] = time.monotonic,
           bodies_for: Callable[[Path], Bodies] = build_bodies) -> ShrinkResult:
    """Shrink the event ``opts`` names; ``progress(line, done, total)`` after every replay and confirmation.
    ``bodies_for(scenario path)``: repro.py's request bodies for the final set (``bodies.build_bodies``)."""
    opts.check()
    started = clock()
    deadline = started + opts.timeout_s
    run = read_run(run_dir)
    secret_sources = sources(run.info, run.scenario)  # each masked value's ${VAR}: never the masked record (restore.py)
    check_and_register(secret_sources, opts.confirmations > 0)
    event = select_event(run, opts.stall, opts.request)
    seeds = seed_set(run, event)
    model = model_of(run)
    threshold_ms = opts.share * event.gap_ms

    def test(cand: tuple[Item, ...]) -> tuple[bool, float]:
        gap = victim_value_ms(model, cand, event.victim, event.metric)
        return gap >= threshold_ms, gap

    tries, what = [0], "TTFT" if event.metric == "ttft_ms" else "gap"

    def on_try(t: Try[Item]) -> None:
        tries[0] += 1
        progress(f"{len(t.items)} requests: victim's {what} {t.value:.0f} ms{' (reproduces)' if t.failed else ''}",
                 tries[0], opts.max_tries)

    out = opts.out or run_dir / f"shrink-{event.label}"
    try:  # before the search: a directory that cannot be written fails now, not after the confirmations
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ShrinkError(f"--out {out}: cannot write there: {exc.strerror or exc}") from None
    found = ddmin(seeds, event.victim, test, opts.max_tries, deadline, clock, on_try)
    needed = math.ceil(REQUIRED_SHARE * opts.confirmations)
    items, conf = list(found.items), None
    if opts.confirmations:
        items, conf = _confirmed(found, event, opts, needed, threshold_ms, deadline, clock,
                                 lambda cand: write_scenario(out, run.scenario, run.info, event, cand, run_dir),
                                 lambda line: progress(line, tries[0], opts.max_tries))
    final_scenario = write_scenario(out, run.scenario, run.info, event, items, run_dir)
    progress("building repro.py's request bodies on the target", tries[0], opts.max_tries)
    bodies = bodies_for(final_scenario)
    bodies.bodies = unexpanded(bodies.bodies, secret_sources)
    replay_gap = victim_value_ms(model, items, event.victim, event.metric)
    reproduced = conf.reproduced >= needed if conf is not None else replay_gap >= threshold_ms
    url = "http://127.0.0.1:8000/v1" if (run.info.get("target") or {}).get("simulator") else \
        restored(run.scenario, secret_sources).target.base_url
    write_script(out, script_text(run.info, run.scenario, event, items, opts.share, url, bodies))
    after = conf.streams if conf is not None and conf.streams else _replay_streams(model, items)
    write_figure(out, opts.png, figure_spec(items, event, original_streams(run.chunks, items), after,
                                  "reproduction (target)" if conf is not None and conf.streams else
                                  "reproduction (virtual-time replay)", threshold_ms))
    doc = _doc(run_dir, event, opts, seeds, found, items, replay_gap, conf, needed, reproduced,
               clock() - started, model.source)
    doc["script_prompts"] = {"mode": prompts_mode(bodies), "counter": bodies.counter, "why": bodies.why or None,
                             "counted_tokens": bodies.counted, "asked_tokens": bodies.asked}
    write_json(out, doc)
    return ShrinkResult(out, event, items, replay_gap, found, conf, bodies, reproduced, doc,
                        restored(run.scenario, secret_sources))


def _confirmed(found: DdminResult[Item], event: Event, opts: ShrinkOptions, needed: int, threshold_ms: float,
               deadline: float, clock: Callable[[], float], write: Callable[[list[Item]], Path],
               progress: Callable[[str], None]) -> tuple[list[Item], Confirmation]:
    """The smallest failing set that reproduces on the target in ``needed`` of ``opts.confirmations`` runs: the
    final set first (its first run always, the others while time is left: the command ends by ``deadline`` plus
    one confirmation run), then the next larger ones ddmin saw while time is left; none does: the one with the
    most reproductions (the smaller on a tie). Every run failing (the target is down) stops the search."""
    best: tuple[list[Item], Confirmation] | None = None
    for k, cand in enumerate(found.failing()[:MAX_CANDIDATES] or [found.items]):
        items = list(cand)
        if k and clock() >= deadline:
            break
        conf = confirm(write(items), items.index(event.victim), opts.confirmations, threshold_ms, needed,
                       deadline, lambda line: progress(f"{len(items)} requests: {line}"),
                       metric=event.metric, clock=clock)
        if best is None or conf.reproduced > best[1].reproduced:
            best = items, conf
        if conf.reproduced >= needed or conf.target_down:
            break
    assert best is not None
    return best


def _replay_streams(model: Any, items: list[Item]) -> dict[int, list[int]]:
    gaps = replay_gaps(model, items)
    out = {}
    for row, item in enumerate(items):
        ends = [t for t, _ in gaps.get((item.worker, item.seq), [])]
        firsts = [ends[0] - int(g * 1e6) for _, g in gaps.get((item.worker, item.seq), [])[:1]]
        out[row] = firsts + ends
    return out


def _doc(run_dir: Path, event: Event, opts: ShrinkOptions, seeds: list[Item], found: DdminResult[Item],
         items: list[Item], replay_gap: float, conf: Confirmation | None, needed: int, reproduced: bool,
         wall_s: float, model: str) -> dict[str, Any]:
    return {
        "run": str(run_dir),
        "event": {"label": event.label, "victim": {"worker": event.victim.worker, "seq": event.victim.seq},
                  "t_start_ns": event.t_start_ns, "t_end_ns": event.t_end_ns, "gap_ms": event.gap_ms,
                  "metric": event.metric,
                  "culprits": list(event.culprits), "cause": event.cause},
        "share": opts.share, "threshold_ms": opts.share * event.gap_ms, "model": model,
        "seed_set": len(seeds), "tries": len(found.tries), "max_tries": opts.max_tries,
        "stopped": found.stopped or "1-minimal", "wall_s": round(wall_s, 3),
        "sets_tried": [{"size": len(t.items), "seqs": [i.seq for i in t.items], "victim_gap_ms": round(t.value, 3),
                        "reproduced": t.failed} for t in found.tries],
        "final_set": [{"worker": i.worker, "seq": i.seq, "class_name": i.class_name, "role": role_of(i, event),
                       "offset_s": round(o, 9), "prompt_tokens": i.prompt_tokens, "output_tokens": i.output_tokens}
                      for i, o in zip(items, offsets_s(items))],
        "replay_gap_ms": replay_gap,
        "confirmations": None if conf is None else {
            "runs": conf.runs, "asked": opts.confirmations, "needed": needed, "reproduced": conf.reproduced,
            "rate": conf.rate, "gaps_ms": conf.gaps_ms, "errors": conf.errors},
        "reproduced": reproduced,
        "files": {"scenario": "scenario.yaml", "trace": "trace.csv", "script": "repro.py",
                  "figure": "figure.png", "figure_spec": "figure.vl.json"},
    }
