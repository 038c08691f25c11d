"""The event loop a run sends on, and the signals it takes (``loadgen run``'s, and each ``--workers`` process's)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
from typing import Any, Awaitable, Callable, TypeVar

from loadgen.run import exits

T = TypeVar("T")


def event_loop_run(coro: Any) -> Any:
    """The run on an event loop of its own: on this thread, or on a fresh one (waited for) when this thread
    already runs a loop (a notebook, an async caller of loadgen.api)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return new_loop_run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="loadgen-run") as pool:
        return pool.submit(new_loop_run, coro).result()


def new_loop_run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def handle_signals(loop: asyncio.AbstractEventLoop, handler: Any) -> list[int]:
    """SIGINT and SIGTERM to ``handler`` where this thread may take them; the signals handled."""
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, handler)
        except (ValueError, RuntimeError, NotImplementedError):  # only the main thread gets signals
            break
        handled.append(sig)
    return handled


async def interruptible(body: Awaitable[T], on_signal: Callable[[], bool]) -> T:
    """``body`` with SIGINT and SIGTERM going to ``on_signal`` (where this thread takes signals). It returns True
    while the run is still preparing: ``body`` is then cancelled and the run ends as ``exits.Interrupted``;
    False once it sends (``on_signal`` stopped the sending itself: in flight → cancelled, recorded)."""
    loop, main, preparing = asyncio.get_running_loop(), asyncio.current_task(), False

    def handler() -> None:
        nonlocal preparing
        if on_signal() and main is not None:
            preparing = True
            main.cancel()
    handled = handle_signals(loop, handler)
    try:
        return await body
    except asyncio.CancelledError:
        if preparing:
            raise exits.Interrupted() from None
        raise
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
