"""Theory of operation: the continuous-batching scheduler, as a pure state machine.

The engine holds ``waiting`` (FCFS queue) and ``running`` (admission order). ``plan_step()`` forms one iteration
the way the configured ``engine``'s scheduler does (each read from its source):

- **vllm** (V1 ``Scheduler.schedule``): one token budget ``max_num_batched_tokens`` per step. Every running
  request gets its slice first: one decode token, or (chunked prefill) the next chunk of its prompt; if the KV
  cache cannot hold a running request's next token, the *newest* running request is preempted (recompute: it
  loses its KV, goes back to the head of the queue and prefills prompt + output again). Then waiting requests
  are admitted FCFS while ``max_num_seqs``, the budget and the free KV allow. With ``chunked_prefill`` a prompt
  is split to fit the budget; without it a prompt goes in whole (the first prefill of a step is always
  admitted, as if the budget were ``max_model_len``) — the long step that stalls every running decode at once.
- **llamacpp** (``server_context::update_slots``): the same mixed batch, but a prompt is always cut into
  ``n_batch`` slices (``max_num_batched_tokens``) that ride along with the decodes; ``max_num_seqs`` is the
  number of slots. A prompt a bit longer than one slice gets its first token one short step after the long one.
- **sglang** (``Scheduler.get_next_batch_to_run``): prefill first. When a prompt is waiting (or a chunked one
  is half done) the step is a prefill-only batch of at most ``max_num_batched_tokens`` prompt tokens
  (``chunked_prefill_size``); the running decodes wait for it and resume in the next step.
- **tgi** (the router's ``batching_task``): prefill-only batches too, but a new batch is formed only when
  the queue holds ``waiting_served_ratio`` × the running batch, or after ``max_waiting_tokens`` decode steps,
  or when nothing is running.

KV: vllm and sglang write a request's KV as it grows and preempt when it runs out (above). llamacpp and tgi
never preempt: they hold a request's whole context from its admission (``EngineConfig.reserves_kv``). llama.cpp's
server (``tools/server/server.cpp``, ``server_context``'s slots) gives each request a slot whose context is its
own until the request ends (no recompute preemption); TGI's router (``backends/v3/src/queue.rs``
``State::next_batch``) takes a queued request into a batch only when ``block_allocator.allocate(input_length +
max_new_tokens + speculate - 1)`` succeeds, and otherwise puts it back at the queue's front. So here the head
of the queue is admitted only when the free KV holds its rest of prompt (the prefix cache's hit included) +
``max_tokens``; all of it counts as used at once (``SimRequest.reserved``: held beyond what is written), and its
later chunks and decodes draw on that. On these two a small KV cache is an admission queue, not preemption.

``finish_step()`` applies the step at its end: prefills that completed and all decodes each emit one token,
finished requests leave and free their KV (reservation included). Time never enters here; ``runtime.py`` owns
the clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .config import EngineConfig
from .costmodel import PrefillChunk, step_ms
from .prefix_cache import PrefixCache, block_hashes, generated_tokens
from .reasoning import PhasePlan


@dataclass(eq=False)
class SimRequest:
    id: str
    prompt_tokens: int
    max_tokens: int
    stop_after: int  # output length at which the request finishes (== max_tokens unless it stops early)
    t_arrival_ns: int = 0
    tokens: list[str] | None = None  # the prompt's token strings (prefix caching: its blocks' hashes)
    # on_token(req, index) is called when the step that generates token ``index`` is planned and returns the
    # action that delivers it at the step's end (or None); on_finish(req, reason) runs after delivery.
    on_token: Callable[["SimRequest", int], Callable[[], None] | None] = lambda req, index: None
    on_finish: Callable[["SimRequest", str], None] = lambda req, reason: None
    generated: int = 0
    kv_tokens: int = 0
    reserved: int = 0  # KV tokens held beyond kv_tokens: the rest of its context (engines that reserve_kv)
    prefilled: int = 0
    prefill_target: int = 0
    preemptions: int = 0
    t_first_token_ns: int | None = None
    t_last_token_ns: int | None = None
    t_prev_token_ns: int | None = None  # the token before the last one (for inter-token latency)
    finish_reason: str | None = None
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at its first admission
    block_hashes: list[int] = field(default_factory=list)
    plan: PhasePlan | None = None  # its reasoning / tool-call phases (None: all answer), reasoning.py

    def __post_init__(self) -> None:
        self.prefill_target = self.prompt_tokens

    @property
    def decoding(self) -> bool:
        return self.prefilled >= self.prefill_target


@dataclass
class Step:
    prefills: list[tuple[SimRequest, PrefillChunk]] = field(default_factory=list)
    decodes: list[SimRequest] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes)

    @property
    def num_tokens(self) -> int:
        return sum(c.tokens for _, c in self.prefills) + len(self.decodes)


class Engine:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.kv_used = 0
        self.num_preemptions = 0
        self.decode_steps_waited = 0  # TGI: decode steps since a waiting request last got a prefill batch
        self.prefix_cache = (PrefixCache(cfg.block_size_tokens, cfg.kv_cache_tokens // cfg.block_size_tokens)
                             if cfg.prefix_caching else None)

    @property
    def kv_free(self) -> int:
        return self.cfg.kv_cache_tokens - self.kv_used

    def add(self, req: SimRequest) -> None:
        if self.prefix_cache is not None and req.tokens is not None:
            req.block_hashes = block_hashes(req.tokens, self.cfg.block_size_tokens)
        self.waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away) wherever it is, freeing its KV."""
        if req in self.running:
            self.running.remove(req)
            self._release(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ---- planning -------------------------------------------------------------------------------------
    def plan_step(self) -> Step:
        if self.cfg.prefill_only_batches:
            return self._plan_prefill_first()
        step = Step()
        budget = self._schedule_running(step, self.cfg.max_num_batched_tokens)
        self._admit_waiting(step, budget)
        return step

    def _plan_prefill_first(self) -> Step:
        """SGLang and TGI: a prefill-only step when a prefill is due, else a decode-only step."""
        step = Step()
        if self._prefill_due():
            budget = self._schedule_running(step, self.cfg.max_num_batched_tokens, decodes=False)
            self._admit_waiting(step, budget)
            if step.prefills:
                self.decode_steps_waited = 0
                return step
        self._schedule_running(step, len(self.running), prefills=False)
        if self.waiting:
            self.decode_steps_waited += 1
        return step

    def _prefill_due(self) -> bool:
        decoding = sum(1 for r in self.running if r.decoding)
        if decoding < len(self.running) or not decoding:  # a chunked prompt is half done, or nothing runs
            return True
        if not self.waiting:
            return False
        if self.cfg.engine != "tgi":
            return True
        return (len(self.waiting) >= self.cfg.waiting_served_ratio * decoding
                or self.decode_steps_waited >= self.cfg.max_waiting_tokens)

    def _schedule_running(self, step: Step, budget: int, decodes: bool = True, prefills: bool = True) -> int:
        for req in list(self.running):
            if req not in self.running or budget <= 0 or not (decodes if req.decoding else prefills):
                continue
            need = 1 if req.decoding else min(req.prefill_target - req.prefilled, budget)
            if not self._reserve_kv(req, need, step):
                continue
            if req.decoding:
                step.decodes.append(req)
            else:
                step.prefills.append((req, PrefillChunk(need, req.prefilled)))
            budget -= need
        return budget

    def _reserve_kv(self, req: SimRequest, need: int, step: Step) -> bool:
        """Make room for ``need`` more tokens of ``req``: from its reservation (llama.cpp, TGI), else by
        preempting the newest running requests."""
        if self.cfg.reserves_kv:
            # Its admission reserved prompt + max(max_tokens, stop_after); it writes at most its prompt and
            # stop_after - 1 decode tokens (the first token comes with the prefill), so this never runs short.
            assert need <= req.reserved, f"{req.id}: {need} KV tokens beyond its reservation {req.reserved}"
            req.reserved -= need
            req.kv_tokens += need
            return True
        while self.kv_free < need:
            victim = self.running[-1]
            self._preempt(victim, step)
            if victim is req:
                return False
        self.kv_used += need
        req.kv_tokens += need
        return True

    def _preempt(self, victim: SimRequest, step: Step) -> None:
        self.running.remove(victim)
        self._release(victim)
        victim.prefilled = 0
        victim.prefill_target = victim.prompt_tokens + victim.generated
        victim.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        step.preempted.append(victim)

    def _release(self, req: SimRequest) -> None:
        """Free the KV ``req`` holds: what it wrote and what it still had reserved."""
        self.kv_used -= req.kv_tokens + req.reserved
        req.kv_tokens = req.reserved = 0

    def _admit_waiting(self, step: Step, budget: int) -> None:
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            hit = self._cached(req)
            remaining = req.prefill_target - req.prefilled - hit
            if self.cfg.splits_prompts:
                need = min(remaining, budget)
            elif remaining <= budget or not step.prefills:
                need = remaining
            else:
                break
            held = self._held_at_admission(req, need + hit)
            if need <= 0 or self.kv_free < held:
                break
            self.waiting.popleft()
            self.running.append(req)
            if self.prefix_cache is not None and not req.prefilled:
                self._use_cache(req)
            self.kv_used += held
            req.kv_tokens += need + hit
            req.reserved = held - need - hit
            step.prefills.append((req, PrefillChunk(need, req.prefilled)))
            budget -= need

    def _held_at_admission(self, req: SimRequest, written: int) -> int:
        """KV tokens admitting ``req`` takes: those it writes now, or (llama.cpp, TGI) its whole remaining
        context: the rest of its prompt (the prefix cache's hit included) and its output up to max_tokens."""
        if not self.cfg.reserves_kv:
            return written
        return req.prefill_target - req.prefilled + max(req.max_tokens, req.stop_after) - req.generated

    def _cached(self, req: SimRequest) -> int:
        """Prompt tokens of ``req`` the prefix cache holds, when it is admitted from scratch."""
        if self.prefix_cache is None or req.prefilled or not req.block_hashes:
            return 0
        hit = min(self.prefix_cache.match_tokens(req.block_hashes), req.prefill_target - 1)
        return hit - hit % self.cfg.block_size_tokens

    def _use_cache(self, req: SimRequest) -> None:
        assert self.prefix_cache is not None
        hit = self.prefix_cache.use(req.block_hashes, req.prefill_target)
        req.prefilled = hit
        if not req.preemptions:
            req.cached_tokens = hit

    def step_duration_ms(self, step: Step) -> float:
        """Modelled duration of ``step`` in real milliseconds (``time_scale`` applied)."""
        contexts = [r.kv_tokens for r in step.decodes]
        return step_ms(self.cfg, [c for _, c in step.prefills], contexts) * self.cfg.time_scale

    # ---- applying -------------------------------------------------------------------------------------
    def finish_step(self, step: Step, t_end_ns: int) -> list[tuple[SimRequest, int]]:
        """Apply ``step`` ending at ``t_end_ns``; return the (request, token index) emitted, in order."""
        emitted: list[tuple[SimRequest, int]] = []
        for req, chunk in step.prefills:
            req.prefilled += chunk.tokens
            if req.decoding:
                if self.prefix_cache is not None:
                    self.prefix_cache.insert(req.block_hashes)
                emitted.append((req, self._emit(req, t_end_ns)))
        for req in step.decodes:
            if req in self.running:  # an abort during the step removed it
                emitted.append((req, self._emit(req, t_end_ns)))
        for req, _ in emitted:
            if req.generated >= req.stop_after and req in self.running:
                self._finish(req)
        return emitted

    def _emit(self, req: SimRequest, t_ns: int) -> int:
        index = req.generated
        req.generated += 1
        if req.t_first_token_ns is None:
            req.t_first_token_ns = t_ns
        req.t_prev_token_ns = req.t_last_token_ns
        req.t_last_token_ns = t_ns
        return index

    def _finish(self, req: SimRequest) -> None:
        if self.prefix_cache is not None and req.tokens is not None:
            full = len(req.block_hashes)
            parent = req.block_hashes[-1] if full else 0
            self.prefix_cache.insert(block_hashes(req.tokens + generated_tokens(req.generated, req.plan),
                                                  self.cfg.block_size_tokens, parent, full))
        self.running.remove(req)
        self._release(req)
        req.finish_reason = "length" if req.generated >= req.max_tokens else "stop"
