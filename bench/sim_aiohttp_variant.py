"""The simulator's engine behind aiohttp handlers (one task per stream, fed by a queue) — measured by
bench/sim_precision.py --stack aiohttp against the shipped raw-protocol stack. Not used by loadgen itself."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvloop  # noqa: E402
from aiohttp import web  # noqa: E402

from local_target.sim import build_config  # noqa: E402
from local_target.sim import openai_api as api  # noqa: E402
from local_target.sim.engine import SimRequest  # noqa: E402
from local_target.sim.runtime import EngineRuntime  # noqa: E402
from local_target.sim.tokenizer import output_token  # noqa: E402


async def main(errors_path: Path) -> None:
    cfg = build_config("a100-llama-7b")
    runtime = EngineRuntime(cfg)
    errors_ms: list[float] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        prep = api.prepare("chat", await request.json(), cfg)
        queue: asyncio.Queue[tuple[int, int, bool]] = asyncio.Queue()
        req = SimRequest("x", prep.prompt_tokens, prep.max_tokens, prep.max_tokens)
        # the engine asks for a delivery action when it plans the step and runs it at the step's end
        req.on_token = lambda r, i: (lambda item=(i, r.t_last_token_ns, r.finish_reason is not None):
                                     queue.put_nowait(item))
        fmt = api.ChunkFormatter(prep, "chatcmpl-x", 0)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        runtime.submit(req)
        while True:
            index, t_model, last = await queue.get()
            data = fmt.content(output_token(index), "length" if last else None, index + 1)
            errors_ms.append((time.monotonic_ns() - t_model) / 1e6)
            await resp.write(data + (fmt.done() if last else b""))
            if last:
                return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    runtime.start()
    print("listening", site._server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    errors_path.write_text(json.dumps(errors_ms))


if __name__ == "__main__":
    uvloop.run(main(Path(sys.argv[1])))
