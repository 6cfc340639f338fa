"""The ``spec-decode-otel`` command.

Sub-commands live in the modules that own the concept (``parse`` here, ``simulate`` in
the simulator package, ``demo`` in :mod:`spec_decode_otel.demo`); this module only wires
argparse, so importing it stays cheap and optional extras load only when used.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spec-decode-otel",
        description="Per-request speculative-decoding acceptance as OpenTelemetry.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p_parse = sub.add_parser(
        "parse",
        help="turn a saved response, chunk list, JSON lines or raw SSE into a record",
    )
    p_parse.add_argument("file", help="a file path, or - for standard input")

    from spec_decode_otel.simulator.cli import add_arguments as add_simulate_arguments

    p_sim = sub.add_parser("simulate", help="run the speculative-decoding simulator server")
    add_simulate_arguments(p_sim)

    from spec_decode_otel.demo import add_arguments as add_demo_arguments

    p_demo = sub.add_parser("demo", help="run an instrumented workload on the embedded simulator")
    add_demo_arguments(p_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "parse":
        from spec_decode_otel.parsing import run_parse_command

        return run_parse_command(args.file)
    if args.command == "simulate":
        from spec_decode_otel.simulator.cli import run as run_simulator

        return run_simulator(args)
    if args.command == "demo":
        from spec_decode_otel.demo import run as run_demo

        return run_demo(args)
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
