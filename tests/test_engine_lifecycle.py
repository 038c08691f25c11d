"""The asyncio driver's request lifecycle at its edges, in process and without a server: a request cancelled
before its task first ran still gets its one record and leaves the in-flight table, so a run that stops at that
instant ends (it used to wait on that entry forever: the disk-full stop hung about 1 run in 10)."""

from __future__ import annotations

import asyncio

import httpx

from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.drivers.asyncio_engine import AsyncioEngine
from loadgen.drivers.engine_config import EngineConfig
from loadgen.plan.schedule import build_plan
from loadgen.plan.scenario_file import load_scenario
from tests.run_helpers import ROOT


def test_a_request_cancelled_before_its_task_ran_is_recorded_once_and_leaves_in_flight() -> None:
    plan = build_plan(load_scenario(ROOT / "scenarios/smoke.yaml"))
    records: list[RequestRecord] = []

    def on_record(record: RequestRecord, chunks: list[ChunkRecord], answer: str) -> None:
        records.append(record)

    async def body_for(req: object) -> dict[str, object]:
        return {}

    async def scenario() -> None:
        cfg = EngineConfig(url="http://127.0.0.1:9/v1/chat/completions", headers={}, ttft_timeout_s=5,
                           idle_timeout_s=5, max_in_flight=4, duration_s=None, warmup_s=0, concurrency=None)
        async with httpx.AsyncClient() as client:
            engine = AsyncioEngine(cfg, plan, body_for, on_record, client)
            assert plan.requests is not None
            task = engine.spawn(plan.requests[0], 0, b"{}")
            engine.stop("the disk is full")  # before the task's first step: its coroutine never runs
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(0)  # the done callbacks run on the loop's next turn
            assert task.cancelled() and engine.stats.in_flight == {}
            assert engine.stats.cancelled == 1

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert [(r.seq, r.error_kind, r.error_message) for r in records] == [(0, "cancelled", "the disk is full")]
