"""The ``spec-decode-otel`` command.

``parse`` and ``summarize`` need the core alone and run here, over
:mod:`spec_decode_otel.payloads` and :mod:`spec_decode_otel.summary`, which do no I/O of
their own. ``simulate``, ``demo`` and ``check`` need extras: their modules hold their
flags and run them, and a missing extra is named instead of a traceback.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import BinaryIO

from spec_decode_otel import summary
from spec_decode_otel._terminal import OutputError, flush_out, write_out
from spec_decode_otel.payloads import MAX_TEXT_BYTES, detection_from_text

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


def _opened(path: str) -> contextlib.AbstractContextManager[BinaryIO]:
    """The bytes of ``path``, or of standard input for ``-`` (left open)."""
    if path != "-":
        return open(path, "rb")
    if sys.stdin is None:  # started with stdin closed (``<&-``)
        raise OSError("standard input is closed")
    return contextlib.nullcontext(sys.stdin.buffer)


def _encoding(head: bytes) -> str:
    """UTF-8, with or without a byte-order mark, or UTF-16 when a BOM says so (what
    PowerShell 5's ``>`` writes)."""
    return "utf-16" if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "utf-8-sig"


def _read(path: str) -> str:
    """The text of ``path`` (``-``: standard input), refused past ``MAX_TEXT_BYTES``:
    no more is read, so an input that never ends (``/dev/zero``, a stream piped in and
    never closed) costs that much memory and no more."""
    with _opened(path) as raw:
        data = raw.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
        raise ValueError(f"larger than {MAX_TEXT_BYTES // 2**20} MiB")
    return data.decode(_encoding(data))


def _lines(raw: BinaryIO) -> Iterator[str]:
    """The lines of ``raw``, decoded as they are read; one longer than
    ``summary.MAX_LINE_CHARS`` is cut there (and skipped as too long), the rest of it read
    past, so no line costs more memory than that. Lines end at LF, CRLF or CR, as JSON
    Lines do, never inside a JSON string (U+2028 is no line end here)."""
    head = raw.peek(2)[:2] if isinstance(raw, io.BufferedReader) else b""
    text = io.TextIOWrapper(raw, encoding=_encoding(head), newline=None)
    try:
        while line := text.readline(summary.MAX_LINE_CHARS + 1):
            if len(line) > summary.MAX_LINE_CHARS and line[-1] != "\n":
                while (rest := text.readline(summary.MAX_LINE_CHARS)) and rest[-1] != "\n":
                    pass
            yield line
    finally:
        text.detach()  # leaves standard input (or the file, closed by its owner) open


def _error(command: str, message: str) -> int:
    """One line on stderr and exit status 2: what the README promises for bad input."""
    print(f"spec-decode-otel {command}: {message}", file=sys.stderr)
    return 2


def _parse(args: argparse.Namespace) -> int:
    """Print the record of a capture as JSON (``null`` when it has no usable stats)."""
    path, request_path = args.file, args.request
    if path == "-" and request_path == "-":
        # Standard input can be read once: the request would read what the capture left.
        return _error("parse", "- for both the capture and --request: give one as a file")
    request = None
    if request_path is not None:
        try:
            request = json.loads(_read(request_path))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            return _error("parse", f"cannot read {request_path}: {exc}")
        if not isinstance(request, Mapping):
            return _error("parse", f"{request_path} is not a JSON object")
    try:
        found = detection_from_text(_read(path), request)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return _error("parse", f"cannot read {path}: {exc}")
    record = found.record
    if record is None:  # why, on stderr: stdout stays the JSON a script reads
        why = f"{found.outcome.value}: {found.reason}" if found.reason else found.outcome.value
        print(f"spec-decode-otel parse: no record ({why})", file=sys.stderr)
    write_out(json.dumps(record.model_dump(mode="json") if record is not None else None, indent=2))
    return 0


def _summarize(args: argparse.Namespace) -> int:
    """Print the summary of a records file, read line by line (its size costs no memory);
    lines that are not records are left out and counted, the first ones said on stderr,
    so one bad line does not hide the rest. Exit status 1 when no line was a record but
    some were not (not a records file)."""
    path = args.file
    skipped = summary.Skipped()
    try:
        with _opened(path) as raw:
            summaries = summary.summarize(summary.read_rows(_lines(raw), skipped))
    except (OSError, UnicodeDecodeError) as exc:
        return _error("summarize", f"cannot read {path}: {exc}")
    for reason in skipped.reasons:
        print(f"spec-decode-otel summarize: {path}: {reason}", file=sys.stderr)
    if skipped.count > len(skipped.reasons):
        more = skipped.count - len(skipped.reasons)
        print(f"spec-decode-otel summarize: {path}: {more} more lines skipped", file=sys.stderr)
    if args.json:
        write_out(
            json.dumps({**summary.to_json(summaries), "skipped_lines": skipped.count}, indent=2)
        )
    else:
        write_out(summary.render(summaries, "standard input" if path == "-" else path))
    return 1 if skipped.count and not summaries else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        status = _run(args)
        flush_out()  # here, not at exit: a reader that left is caught below
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, as a shell tool does.
        _drop_stdout()
        return 1
    except OutputError as exc:  # a full disk, a closed stdout: say so, as ``cat`` does
        print(f"spec-decode-otel {args.command}: cannot write the output: {exc}", file=sys.stderr)
        _drop_stdout()
        return 1
    except KeyboardInterrupt:  # Ctrl-C (check waiting on a hung server): no traceback
        return 130
    return status


def _drop_stdout() -> None:
    """Send what is left in stdout's buffer to devnull: Python flushes it again at exit,
    which would fail the same way, with a traceback."""
    if sys.stdout is not None:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


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
