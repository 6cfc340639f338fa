"""The ``spec-decode-otel`` command.

Sub-commands live in the modules that own the concept (``parse`` in
:mod:`spec_decode_otel.payloads`, ``summarize`` in :mod:`spec_decode_otel.summary`,
``simulate`` in the simulator package, ``demo`` in :mod:`spec_decode_otel.demo`); this
module only wires argparse. ``parse`` and ``summarize`` need the core alone; ``simulate``
and ``demo`` need their extras and say how to install them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

_EXTRA_HINT = {
    "simulate": "pip install 'spec-decode-otel[simulator]'",
    "demo": "pip install 'spec-decode-otel[demo]'",
}


def _build_parser() -> argparse.ArgumentParser:
    from spec_decode_otel.demo import add_arguments as add_demo_arguments
    from spec_decode_otel.simulator.cli import add_arguments as add_simulate_arguments
    from spec_decode_otel.summary import add_arguments as add_summarize_arguments

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
    p_parse.add_argument(
        "--request",
        metavar="FILE",
        help="the JSON request body the capture answers (needed to read usage-only counts)",
    )
    add_summarize_arguments(
        sub.add_parser(
            "summarize",
            help="per model and engine: acceptance figures and call outcomes of a records file",
        )
    )
    add_simulate_arguments(
        sub.add_parser("simulate", help="run the speculative-decoding simulator server")
    )
    add_demo_arguments(
        sub.add_parser("demo", help="run an instrumented workload on the embedded simulator")
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "parse":
        from spec_decode_otel.payloads import run_parse_command

        return run_parse_command(args.file, args.request)
    if args.command == "summarize":
        from spec_decode_otel.summary import run as run_summarize

        return run_summarize(args)
    try:
        if args.command == "simulate":
            from spec_decode_otel.simulator.cli import run as run_simulator

            return run_simulator(args)
        from spec_decode_otel.demo import run as run_demo

        return run_demo(args)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] == "spec_decode_otel":
            raise
        print(
            f"spec-decode-otel {args.command}: needs {exc.name!r}, which is not installed. "
            f"Install it with: {_EXTRA_HINT[args.command]}",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
