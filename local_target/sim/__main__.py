"""``loadgen-sim`` / ``python -m local_target.sim``: run the simulator as a server."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .config import PRESETS, DEFAULT_PRESET, EngineConfig, build_config, parse_value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loadgen-sim", description="CPU simulator of a continuous-batching LLM "
                                "server with an OpenAI-compatible API (see local_target/sim/README.md).")
    p.add_argument("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET, help="hardware/model preset")
    p.add_argument("--config", type=Path, help="YAML file of engine fields, applied over the preset")
    p.add_argument("--config-json", help=argparse.SUPPRESS)  # a complete EngineConfig, used by the launcher
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override any field, dotted for faults (e.g. --set faults.error_rate=0.1)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--trace", type=Path, help="write the ground-truth trace (JSON lines) here")
    p.add_argument("--no-uvloop", action="store_true", help="use asyncio's default loop")
    for name, field in EngineConfig.model_fields.items():
        if name != "faults":
            p.add_argument(f"--{name.replace('_', '-')}", dest=f"field_{name}", type=parse_value,
                           metavar="V", help=field.description or f"engine field {name}")
    return p


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    if args.config_json:
        return EngineConfig.model_validate_json(args.config_json)
    overrides: dict[str, Any] = {k[len("field_"):]: v for k, v in vars(args).items()
                                 if k.startswith("field_") and v is not None}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        overrides[key] = parse_value(value)
    return build_config(args.preset, args.config, overrides)


async def _serve(cfg: EngineConfig, args: argparse.Namespace) -> None:
    from .server import serve

    server = await serve(cfg, args.host, args.port, trace_path=args.trace)
    print(f"loadgen-sim listening on {server.base_url} model={cfg.model}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except (ValueError, ValidationError, OSError) as exc:
        print(f"loadgen-sim: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if not args.no_uvloop:
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
    try:
        asyncio.run(_serve(cfg, args))
    except OSError as exc:
        print(f"loadgen-sim: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
