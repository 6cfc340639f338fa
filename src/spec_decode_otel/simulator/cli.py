"""``spec-decode-otel simulate`` (and ``python -m spec_decode_otel.simulator``).

Prints exactly one line, ``serving http://HOST:PORT/v1``, once the server accepts
connections (``--port 0`` picks a free port, so a parent process reads the port from
that line), and exits 0 on SIGINT/SIGTERM after a graceful shutdown.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import ValidationError

from spec_decode_otel.simulator.acceptance import parse_floats, parse_ints
from spec_decode_otel.simulator.config import ENGINES, LEVELS, SimulatorConfig

T = TypeVar("T")


def _argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse type whose ValueError message reaches the user (argparse
    shows a plain ValueError as ``invalid <type> value``)."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return convert


def _model_alpha(text: str) -> tuple[str, tuple[float, ...]]:
    name, sep, value = text.rpartition("=")
    if not sep or not name:
        raise ValueError(f"expected NAME=ALPHA[,ALPHA...], got {text!r}")
    return name, parse_floats(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulator's flags; shared by the top-level CLI and this module's ``main``."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--engine", choices=ENGINES, default="vllm", help="wire shape to speak")
    parser.add_argument(
        "--level", choices=LEVELS, default="detailed", help="vLLM per-request metrics level"
    )
    parser.add_argument("--k", type=int, default=4, help="draft tokens per verify step")
    parser.add_argument(
        "--alpha", type=float, default=0.7, help="per-position conditional acceptance"
    )
    parser.add_argument(
        "--alpha-vector",
        type=_argument_type(parse_floats),
        default=None,
        metavar="A0,A1,...",
        help="conditional acceptance per draft position (overrides --alpha)",
    )
    parser.add_argument(
        "--model",
        dest="model_alphas",
        type=_argument_type(_model_alpha),
        action="append",
        default=[],
        metavar="NAME=ALPHA[,ALPHA...]",
        help="acceptance for one model name (repeatable); listed by /v1/models",
    )
    parser.add_argument(
        "--draft-schedule",
        type=_argument_type(parse_ints),
        default=None,
        metavar="D1,D2,...",
        help="draft length per verify step, cycled (overrides --k)",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed of the per-request RNGs")
    parser.add_argument(
        "--force-include-usage",
        action="store_true",
        help="vLLM: always send the final usage chunk when streaming",
    )
    parser.add_argument(
        "--vllm-timing-metrics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="vLLM: the timing fields of root metrics (its --enable-per-request-metrics)",
    )
    parser.add_argument("--served-model", default="spec-sim", help="model name in /v1/models")
    parser.add_argument("--min-length", type=int, default=64, help="natural length, minimum")
    parser.add_argument("--max-length", type=int, default=256, help="natural length, maximum")
    parser.add_argument(
        "--llamacpp-n-ctx",
        type=int,
        default=None,
        help="llama.cpp: context size; a prompt that fills it is its 400 (default: none)",
    )
    parser.add_argument(
        "--step-delay-ms", type=float, default=0.0, help="real delay between streamed chunks"
    )
    parser.add_argument("--log-level", default="warning", help="uvicorn log level")


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    """Every ``SimulatorConfig`` field from the flag of the same name."""
    fields = {name: getattr(args, name) for name in SimulatorConfig.model_fields}
    fields["model_alphas"] = dict(args.model_alphas)  # --model gives (name, alphas) pairs
    return SimulatorConfig(**fields)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 on a clean stop, 2 on a bad configuration."""
    from spec_decode_otel.simulator.server import bind_socket, make_server, url_for

    try:
        config = config_from_args(args)
    except ValidationError as exc:
        print(f"spec-decode-otel simulate: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(
            f"spec-decode-otel simulate: cannot bind {args.host}:{args.port}: {exc}",
            file=sys.stderr,
        )
        return 1
    server = make_server(config, args.log_level)
    url = url_for(args.host, sock.getsockname()[1]) + "/v1"
    original_startup = server.startup

    async def startup(sockets: list[socket.socket] | None = None) -> None:
        await original_startup(sockets=sockets)
        if server.started:
            print(f"serving {url}", flush=True)

    server.startup = startup  # type: ignore[method-assign]
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spec_decode_otel.simulator",
        description="OpenAI-compatible speculative-decoding simulator (every engine's shape).",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
