"""Records from saved payloads, without any client: JSON bodies, chunk lists, SSE text.

Used by ``spec-decode-otel parse`` and by anyone replaying logs or captures (core only:
no SDK, no server, no extra needed). A response
body gives one record; a list of stream chunks gives one record for the whole stream.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from spec_decode_otel._logging import logger
from spec_decode_otel.adapters.registry import detect
from spec_decode_otel.capture import ParsedResponse
from spec_decode_otel.record import SpecDecodeAcceptanceRecord

#: Inputs larger than this are refused by :func:`parse_payloads` (64 MiB of text is
#: far beyond any real response or stream capture).
MAX_TEXT_BYTES = 64 * 1024 * 1024


def record_from_json(
    body: Any, request: Mapping[str, Any] | None = None
) -> SpecDecodeAcceptanceRecord | None:
    """The record for a decoded response body (dict) or stream (list of chunk dicts).

    ``request`` is the JSON body of the request the payload answers, when known. Some
    shapes are read only with it: ``usage.completion_tokens_details``' prediction-token
    pair counts speculative decoding only when the request carried no ``prediction``
    (otherwise it is OpenAI's Predicted Outputs), so without a request it is not read.

    Never raises: anything that is not a recognisable, self-consistent payload gives None.
    """
    try:
        if isinstance(body, Mapping):
            chunks: Sequence[Any] = (body,)
        elif isinstance(body, list):
            chunks = body
        else:
            return None
        if not isinstance(request, Mapping):
            request = None
        responses = [
            p for p in (ParsedResponse.from_dict(c, request) for c in chunks) if p is not None
        ]
        return detect(responses)
    except Exception:  # defensive: detect() already isolates adapters
        logger.debug("record_from_json failed", exc_info=True)
        return None


def parse_payloads(text: str) -> list[Any]:
    """Decode a JSON body, a JSON array of chunks, JSON lines, or raw SSE into payloads.

    Raises ValueError when the text is none of those. SSE events whose data does not
    decode (a capture cut mid-line) are skipped, as a client would drop them.
    """
    if len(text) > MAX_TEXT_BYTES:
        raise ValueError("input too large")
    stripped = text.strip()
    if not stripped:
        raise ValueError("empty input")
    try:
        return _decode(stripped)
    except RecursionError:  # json raises it for deeply nested arrays/objects
        raise ValueError("JSON nested too deeply") from None


def _decode(stripped: str) -> list[Any]:
    if _looks_like_sse(stripped):
        return _parse_sse(stripped)
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        pass
    else:
        return whole if isinstance(whole, list) else [whole]
    payloads = []
    for number, line in enumerate(stripped.splitlines(), 1):
        if line.strip():
            try:
                payloads.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"line {number} is not JSON: {exc.msg}") from None
    return payloads


def _looks_like_sse(text: str) -> bool:
    first = text.lstrip().split("\n", 1)[0]
    return first.startswith(("data:", "event:", "id:", ":", "retry:"))


def _parse_sse(text: str) -> list[Any]:
    payloads: list[Any] = []
    data: list[str] = []

    def flush() -> None:
        if not data:
            return
        joined = "\n".join(data)
        data.clear()
        if joined.strip() == "[DONE]":
            return
        try:
            payloads.append(json.loads(joined))
        except (ValueError, RecursionError):  # not JSON, an int past the digit limit, too deep
            logger.debug("skipping an SSE event whose data is not JSON")

    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if not line:
            flush()
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    flush()
    if not payloads:
        raise ValueError("no JSON data events in SSE input")
    return payloads


def record_from_text(
    text: str, request: Mapping[str, Any] | None = None
) -> SpecDecodeAcceptanceRecord | None:
    """Decode ``text`` (any form :func:`parse_payloads` reads) and detect its record
    (``request`` as in :func:`record_from_json`)."""
    payloads = parse_payloads(text)
    return record_from_json(payloads[0] if len(payloads) == 1 else payloads, request)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def run_parse_command(path: str, request_path: str | None = None) -> int:
    """``spec-decode-otel parse FILE|- [--request FILE]``: print the record as JSON (or
    ``null``). ``--request`` names the JSON request body the capture answers."""
    request = None
    if request_path is not None:
        try:
            request = json.loads(_read(request_path))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            print(f"spec-decode-otel parse: cannot read {request_path}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(request, Mapping):
            print(f"spec-decode-otel parse: {request_path} is not a JSON object", file=sys.stderr)
            return 2
    try:
        record = record_from_text(_read(path), request)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print(f"spec-decode-otel parse: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(record.model_dump(mode="json") if record is not None else None, indent=2))
    return 0
