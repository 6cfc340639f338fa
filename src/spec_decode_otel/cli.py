"""The ``spec-decode-otel`` command.

``parse`` and ``summarize`` need the core alone and run here, over
:mod:`spec_decode_otel.payloads` and :mod:`spec_decode_otel.summary`, which do no I/O of
their own. ``simulate``, ``demo`` and ``check`` need extras: their modules hold their
flags and run them, and a missing extra is named instead of a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence

from spec_decode_otel import summary
from spec_decode_otel.payloads import record_from_text

_EXTRA_HINT = {
    "simulate": "pip install 'spec-decode-otel[simulator]'",
    "demo": "pip install 'spec-decode-otel[demo]'",
    "check": "pip install 'spec-decode-otel[instruments,otlp]'",
}


def _build_parser() -> argparse.ArgumentParser:
    from spec_decode_otel import check, demo
    from spec_decode_otel.simulator import cli as simulator_cli

    parser = argparse.ArgumentParser(
        prog="spec-decode-otel",
        description="Per-request speculative-decoding acceptance as OpenTelemetry.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    parse = sub.add_parser(
        "parse",
        help="turn a saved response, chunk list, JSON lines or raw SSE into a record",
    )
    parse.add_argument("file", help="a file path, or - for standard input")
    parse.add_argument(
        "--request",
        metavar="FILE",
        help="the JSON request body the capture answers (needed to read usage-only counts)",
    )
    parse.set_defaults(run=_parse)
    summarize = sub.add_parser(
        "summarize",
        help="per model and engine: acceptance figures and call outcomes of a records file",
    )
    summarize.add_argument("file", help="a records file (JSON lines), or - for standard input")
    summarize.add_argument("--json", action="store_true", help="print the summary as JSON")
    summarize.set_defaults(run=_summarize)
    for module, name, about in (
        (simulator_cli, "simulate", "run the speculative-decoding simulator server"),
        (demo, "demo", "run an instrumented workload on the embedded simulator"),
        (check, "check", "ask a live server whether its responses carry spec-decode stats"),
    ):
        command = sub.add_parser(name, help=about)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def _read(path: str) -> str:
    """The text of ``path``, or of standard input for ``-``."""
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _error(command: str, message: str) -> int:
    """One line on stderr and exit status 2: what the README promises for bad input."""
    print(f"spec-decode-otel {command}: {message}", file=sys.stderr)
    return 2


def _parse(args: argparse.Namespace) -> int:
    """Print the record of a capture as JSON (``null`` when it has no usable stats)."""
    path, request_path = args.file, args.request
    request = None
    if request_path is not None:
        try:
            request = json.loads(_read(request_path))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            return _error("parse", f"cannot read {request_path}: {exc}")
        if not isinstance(request, Mapping):
            return _error("parse", f"{request_path} is not a JSON object")
    try:
        record = record_from_text(_read(path), request)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return _error("parse", f"cannot read {path}: {exc}")
    print(json.dumps(record.model_dump(mode="json") if record is not None else None, indent=2))
    return 0


def _summarize(args: argparse.Namespace) -> int:
    """Print the summary of a records file; lines that are not records are reported on
    stderr and left out, so one bad line does not hide the rest."""
    path = args.file
    try:
        text = _read(path)
    except (OSError, UnicodeDecodeError) as exc:
        return _error("summarize", f"cannot read {path}: {exc}")
    rows, problems = summary.read_rows(text.splitlines())
    for problem in problems:
        print(f"spec-decode-otel summarize: {path}: {problem}", file=sys.stderr)
    summaries = summary.summarize(rows)
    if args.json:
        print(json.dumps({**summary.to_json(summaries), "skipped_lines": len(problems)}, indent=2))
    else:
        print(summary.render(summaries, "standard input" if path == "-" else path))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        status = _run(args)
        sys.stdout.flush()  # here, not at exit: a reader that left is caught below
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, as a shell tool does. Python
        # flushes stdout again at exit, so stdout goes to devnull first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:  # Ctrl-C (check waiting on a hung server): no traceback
        return 130
    return status


def _run(args: argparse.Namespace) -> int:
    try:
        status: int = args.run(args)
    except ModuleNotFoundError as exc:
        hint = _EXTRA_HINT.get(args.command)  # parse and summarize need no extra
        if hint is None or exc.name is None or exc.name.split(".")[0] == "spec_decode_otel":
            raise
        print(
            f"spec-decode-otel {args.command}: needs {exc.name!r}, which is not installed. "
            f"Install it with: {hint}",
            file=sys.stderr,
        )
        return 3
    return status
